# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The probe's main job: sample E/U batches from a model on arithmetic prompts, compare naive and RB ΔH₁.

Per run: one U batch (Y and the real step; a fresh one per repeat with ``run.resample_U``), ``run.repeats`` fresh
E batches, X per estimator per E batch, one ground-truth step measured on every E batch, and the covariance estimate
of Cui et al. on U. With a fixed U the spread of ΔH₁ over repeats is the spread of the X estimator alone. The
``residual_mu`` baseline starts from U's residuals (one forward, independent of every E), so repeat 0 does not run
with μ = 0.
Prints a table and writes ``<run.output_dir>/probe_results.json``.

This module only wires the pieces together: ``model_loading`` → ``optimizers`` (build, state warm-up) →
``task_sampler`` (batches) → ``mixed_probe`` (Δθ/lr once per U, then ``run_mixed_probe`` per E and estimator, with the
ground truth of ``ground_truth.py`` measured once per U) → ``covariance`` → ``report``.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.covariance import covariance_entropy_change
from treetune_verl.probe.ground_truth import TRUTH_KEYS, true_entropy_change, truth_of_batch
from treetune_verl.probe.mixed_probe import estimate_mean_Y, resolve_lr, run_mixed_probe
from treetune_verl.probe.model_loading import load_model_and_tokenizer
from treetune_verl.probe.optimizers import build_optimizer, state_step, warm_up_optimizer_state
from treetune_verl.probe.report import estimator_entries, format_table, per_repeat_rows, std_ratio
from treetune_verl.probe.task_sampler import ArithmeticBatchSampler

# The job's pieces, importable from here as before they had modules of their own.
__all__ = ["ArithmeticBatchSampler", "build_optimizer", "format_table", "load_model_and_tokenizer", "run_probe_job"]


def run_probe_job(config: DictConfig | dict | None) -> dict[str, Any]:
    """Run the main job; returns the results written to JSON."""
    cfg = resolve_config(config)
    seed, repeats, mb = int(cfg.run.seed), int(cfg.run.repeats), int(cfg.probe.mb_size_prompts)
    B_E, B_U = int(cfg.batch.B_E), int(cfg.batch.B_U)
    torch.manual_seed(seed)
    model, tokenizer, model_name = load_model_and_tokenizer(cfg.model)
    optimizer = build_optimizer(cfg.optimizer, [p for p in model.parameters() if p.requires_grad])
    lr = resolve_lr(cfg, optimizer)
    estimators = list(cfg.run.estimators)
    configs = {name: OmegaConf.merge(cfg, {"estimator": {"x_estimator_mode": name}}) for name in estimators}
    components = {name: ProbeComponents(model, configs[name], optimizer) for name in estimators}
    main = components[estimators[0]]
    sampler = ArithmeticBatchSampler(model, tokenizer, cfg, seed)
    n_U = repeats if cfg.run.resample_U else 1
    u_of_repeat = [r if cfg.run.resample_U else 0 for r in range(repeats)]
    warmup = int(cfg.optimizer.state_warmup_batches) if cfg.optimizer.name != "sgd" else 0
    n_truth = n_U if cfg.ground_truth.enable else 0
    total_tasks = warmup + n_U + repeats + n_U + n_truth + repeats * len(estimators) + 1
    bar = tqdm(total=total_tasks, desc="entropy probe", disable=not cfg.run.progress)
    timing: dict[str, list[float]] = {"sample_s": [], "Y_s": [], "ground_truth_s": [], "train_step_s": []}
    timing.update({f"X_s[{name}]": [] for name in estimators})

    def warmup_batches() -> Iterator[dict[str, torch.Tensor]]:  # drawn lazily: the bar ticks per warm-up step
        for _ in range(warmup):
            bar.set_postfix_str("optimizer state warm-up")
            yield sampler.sample(B_U)[0]
            bar.update()

    warm_up_optimizer_state(main, warmup_batches(), mb, optimizer)

    def timed_sample(B: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        start = time.perf_counter()
        out = sampler.sample(B)
        timing["sample_s"].append(time.perf_counter() - start)
        bar.update()
        return out

    bar.set_postfix_str("sampling")
    U_batches = [timed_sample(B_U) for _ in range(n_U)]
    E_batches = [timed_sample(B_E) for _ in range(repeats)]

    # residual_mu starts from U's residuals (independent of every E), not from μ = 0 at repeat 0
    for component in components.values():
        for U, _ in U_batches:
            component.warm_baseline(U, mb, "U_batch")

    # Δθ/lr once per U batch, shared by every E batch and estimator probed against it.
    mean_Ys = []
    for U, _ in U_batches:
        bar.set_postfix_str("Y")
        mean_Ys.append(estimate_mean_Y(main, U, mb, optimizer))
        timing["Y_s"].append(mean_Ys[-1].seconds)
        bar.update()

    # One real step per U batch, measured on every E batch probed against it.
    truths: list[dict[str, float] | None] = [None] * repeats
    if cfg.ground_truth.enable:
        for u, (U, _) in enumerate(U_batches):
            bar.set_postfix_str("ground truth")
            repeats_of_u = [r for r in range(repeats) if u_of_repeat[r] == u]
            out = true_entropy_change(main, [E_batches[r][0] for r in repeats_of_u], U, mb, optimizer, lr)
            timing["ground_truth_s"].append(out["ground_truth_s"])
            timing["train_step_s"].append(out["train_step_s"])
            for i, r in enumerate(repeats_of_u):
                truths[r] = truth_of_batch(out, i)
            bar.update()

    probes: dict[str, list[dict[str, Any]]] = {name: [] for name in estimators}
    for r, (E, _) in enumerate(E_batches):
        u = u_of_repeat[r]
        for name in estimators:
            bar.set_postfix_str(f"X {name}")
            result = run_mixed_probe(
                model,
                E,
                U_batches[u][0],
                configs[name],
                optimizer,
                components[name],
                mean_Y=mean_Ys[u],
                ground_truth=truths[r],
                log_level=logging.DEBUG,
            )
            probes[name].append(result)
            timing[f"X_s[{name}]"].append(result["timing"]["X_s"])
            bar.update()

    bar.set_postfix_str("covariance estimate")
    cov = [covariance_entropy_change(main, U, mb, lr) for U, _ in U_batches]
    bar.update()
    bar.close()

    results: dict[str, Any] = {
        "model": model_name,
        "device": str(next(model.parameters()).device),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "lr": lr,
        "optimizer_state_step": state_step(optimizer),
        **mean_Ys[0].preconditioner,
        "mean_reward_U": statistics.fmean(info["mean_reward"] for _, info in U_batches),
        "example": U_batches[0][1]["example"],
        "per_repeat": per_repeat_rows(probes),
        "ground_truth": {key: [t[key] for t in truths] for key in TRUTH_KEYS} if cfg.ground_truth.enable else {},
        "cui_covariance_deltaH": cov,
        "timing_median_s": {k: statistics.median(v) for k, v in timing.items() if v},
        "estimators": estimator_entries(probes),
    }
    ratio = std_ratio(results["estimators"])
    if ratio is not None:
        results["std_ratio_naive_over_rb"] = ratio
    out_dir = Path(str(cfg.run.output_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    results["json_path"] = str(out_dir / "probe_results.json")
    Path(results["json_path"]).write_text(json.dumps(results, indent=2))
    print(format_table(results))
    return results
