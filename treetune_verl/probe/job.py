# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The probe's main job: sample E/U batches from a model on arithmetic prompts, compare naive and RB ΔH₁.

Per run: one U batch (Y and the real step; a fresh one per repeat with ``run.resample_U``), ``run.repeats`` fresh
E batches, X per estimator per E batch, one ground-truth step measured on every E batch, and the covariance estimate
of Cui et al. on U. With a fixed U the spread of ΔH₁ over repeats is the spread of the X estimator alone.
Prints a table and writes ``<run.output_dir>/probe_results.json``.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from treetune_verl.probe.advantages import group_advantages
from treetune_verl.probe.arithmetic import ArithmeticItem, arithmetic_prompts, arithmetic_reward
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.components import ProbeComponents, probe_pass_context
from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.covariance import covariance_entropy_change
from treetune_verl.probe.ground_truth import real_step, true_entropy_change
from treetune_verl.probe.mixed_probe import buffer_norm, resolve_lr, target_units
from treetune_verl.probe.preconditioner import AdamPreconditioner
from treetune_verl.probe.sampling import sample_responses

logger = logging.getLogger(__name__)

_MODEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model_and_tokenizer(cfg_model: DictConfig) -> tuple[torch.nn.Module, Any, str]:
    """``(model, tokenizer, name)``; ``model.path = null`` loads the packaged SmolLM2-135M-Instruct."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cfg_model.path is None:
        from treetune_verl.model_cache import smollm2_path

        path = str(smollm2_path())
    else:
        path = str(cfg_model.path)
    device = str(cfg_model.device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_MODEL_DTYPES[str(cfg_model.dtype)]).to(device)
    model.requires_grad_(True)
    model.eval()
    return model, tokenizer, Path(path).name


def build_optimizer(cfg_opt: DictConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """SGD (no momentum) or Adam/AdamW with the configured betas, eps and weight decay."""
    lr = float(cfg_opt.lr)
    if cfg_opt.name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=float(cfg_opt.weight_decay))
    kwargs = {"lr": lr, "betas": tuple(float(b) for b in cfg_opt.betas), "eps": float(cfg_opt.eps)}
    if cfg_opt.name == "adam":
        return torch.optim.Adam(params, weight_decay=float(cfg_opt.weight_decay), **kwargs)
    return torch.optim.AdamW(params, weight_decay=float(cfg_opt.weight_decay), **kwargs)


class ArithmeticBatchSampler:
    """Fresh arithmetic prompts → G sampled responses each → rewards → advantages → probe batch."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, cfg: DictConfig, seed: int) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.rng = random.Random(seed)
        device = next(model.parameters()).device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        eos = set()
        gen_cfg = getattr(model, "generation_config", None)
        for source in (getattr(gen_cfg, "eos_token_id", None), tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source is not None:
                eos.update(int(t) for t in source)
        self.eos_token_ids = sorted(eos)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_ids or [0])[0])

    def encode(self, item: ArithmeticItem) -> list[int]:
        """Prompt ids: chat-templated user turn (when the tokenizer has a template) plus the assistant pre-fill."""
        prefill = self.tokenizer(item.prefill, add_special_tokens=False)["input_ids"]
        if self.cfg.generation.use_chat_template and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": item.question}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
            return ids + list(prefill)
        question = self.tokenizer(item.question + "\n", add_special_tokens=False)["input_ids"]
        return list(question) + list(prefill)

    def sample(self, B: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        gen, G = self.cfg.generation, int(self.cfg.batch.G)
        items = arithmetic_prompts(B, int(self.cfg.prompts.max_operand), self.rng)
        prompt_ids = [self.encode(item) for item in items]
        responses, _ = sample_responses(
            self.model,
            prompt_ids,
            G,
            float(gen.temperature),
            float(gen.top_p),
            int(gen.max_new_tokens),
            self.pad_token_id,
            self.eos_token_ids,
            self.generator,
            int(gen.batch_size),
        )
        texts = [[self.tokenizer.decode(r, skip_special_tokens=True) for r in group] for group in responses]
        rewards = torch.tensor(
            [[arithmetic_reward(t, item.answer) for t in group] for group, item in zip(texts, items, strict=True)]
        )
        adv = group_advantages(rewards, str(self.cfg.advantage.estimator), float(self.cfg.advantage.eps))
        # L_max = the generation budget: a per-prompt constant, so the estimators are exactly unbiased.
        batch = make_probe_batch(prompt_ids, responses, adv, self.pad_token_id, [int(gen.max_new_tokens)] * B)
        example = {
            "prompt": f"{items[0].question} | {items[0].prefill}",
            "response": texts[0][0],
            "reward": float(rewards[0, 0]),
        }
        info = {"mean_reward": float(rewards.mean()), "example": example}
        return batch, info


def _summary(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "median": statistics.median(values),
    }


def run_probe_job(config: DictConfig | dict | None) -> dict[str, Any]:
    """Run the main job; returns the results written to JSON."""
    cfg = resolve_config(config)
    seed, repeats = int(cfg.run.seed), int(cfg.run.repeats)
    torch.manual_seed(seed)
    model, tokenizer, model_name = load_model_and_tokenizer(cfg.model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(cfg.optimizer, params)
    lr = resolve_lr(cfg, optimizer)
    mb = int(cfg.probe.mb_size_prompts)
    estimators = list(cfg.run.estimators)
    components = {
        name: ProbeComponents(model, OmegaConf.merge(cfg, {"estimator": {"x_estimator_mode": name}}), optimizer)
        for name in estimators
    }
    main = components[estimators[0]]
    sampler = ArithmeticBatchSampler(model, tokenizer, cfg, seed)
    n_U = repeats if cfg.run.resample_U else 1
    warmup = int(cfg.optimizer.state_warmup_batches) if cfg.optimizer.name != "sgd" else 0
    n_truth = n_U if cfg.ground_truth.enable else 0
    total_tasks = warmup + n_U + repeats + n_U + repeats * len(estimators) + n_truth + 1
    bar = tqdm(total=total_tasks, desc="entropy probe", disable=not cfg.run.progress)
    timing: dict[str, list[float]] = {"sample_s": [], "Y_s": [], "ground_truth_s": [], "train_step_s": []}
    timing.update({f"X_s[{name}]": [] for name in estimators})

    # Populate Adam's second moments without moving the weights: steps at lr = 0 on fresh batches.
    for _ in range(warmup):
        bar.set_postfix_str("optimizer state warm-up")
        W, _ = sampler.sample(int(cfg.batch.B_U))
        saved_lrs = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        with probe_pass_context(model, main.params):
            real_step(main, W, mb, optimizer)
        for group, saved in zip(optimizer.param_groups, saved_lrs, strict=True):
            group["lr"] = saved
        bar.update()

    def timed_sample(B: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        start = time.perf_counter()
        out = sampler.sample(B)
        timing["sample_s"].append(time.perf_counter() - start)
        bar.update()
        return out

    bar.set_postfix_str("sampling")
    U_batches = [timed_sample(int(cfg.batch.B_U)) for _ in range(n_U)]
    E_batches = [timed_sample(int(cfg.batch.B_E)) for _ in range(repeats)]

    preconditioner = AdamPreconditioner(optimizer, main.params)
    mean_Ys = []
    for U, _ in U_batches:
        bar.set_postfix_str("Y")
        sum_Y, B_U = main.accumulate_sum_Y(U, mb, preconditioner)
        timing["Y_s"].append(main.last_timing["Y_s"])
        mean_Ys.append(main.scale_buffer(sum_Y, 1.0 / B_U))
        bar.update()

    per_repeat: list[dict[str, Any]] = []
    for r, (E, _) in enumerate(E_batches):
        row: dict[str, Any] = {"repeat": r}
        mean_Y = mean_Ys[r if cfg.run.resample_U else 0]
        for name in estimators:
            bar.set_postfix_str(f"X {name}")
            sum_X, B_E = components[name].accumulate_sum_X(E, mb)
            timing[f"X_s[{name}]"].append(components[name].last_timing["X_s"])
            mean_X = main.scale_buffer(sum_X, 1.0 / B_E)
            bars_dot = main.dot_param_buffers(mean_X, mean_Y)
            row[name] = {"bars_dot": bars_dot, "deltaH1": lr * bars_dot, "norm_X": buffer_norm(mean_X)}
            bar.update()
        per_repeat.append(row)

    truth: dict[str, list[float]] = {}
    if cfg.ground_truth.enable:
        bar.set_postfix_str("ground truth")
        if cfg.run.resample_U:  # one real step per U, measured on its own repeat's E
            groups = [[(r, E)] for r, (E, _) in enumerate(E_batches)]
        else:  # one real step, measured on every E
            groups = [[(r, E) for r, (E, _) in enumerate(E_batches)]]
        for u_index, group in enumerate(groups):
            U = U_batches[u_index][0]
            out = true_entropy_change(main, [E for _, E in group], U, mb, optimizer, lr)
            timing["ground_truth_s"].append(out["ground_truth_s"])
            timing["train_step_s"].append(out["train_step_s"])
            for i, (r, _) in enumerate(group):
                for key in ("deltaH_true", "deltaH_true_per_sequence", "H_before", "H_after", "min_ess"):
                    truth.setdefault(key, [0.0] * repeats)[r] = out[key][i]
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
        **preconditioner.describe(),
        "mean_reward_U": statistics.fmean(info["mean_reward"] for _, info in U_batches),
        "example": U_batches[0][1]["example"],
        "per_repeat": per_repeat,
        "ground_truth": truth,
        "cui_covariance_deltaH": cov,
        "timing_median_s": {k: statistics.median(v) for k, v in timing.items() if v},
        "estimators": {},
    }
    for name in estimators:
        units = target_units(components[name])
        values = [row[name]["deltaH1"] for row in per_repeat]
        entry: dict[str, Any] = {"units": units, "deltaH1": _summary(values)}
        if truth:
            key = "deltaH_true_per_sequence" if units == "nats per sequence" else "deltaH_true"
            entry["deltaH_true"] = _summary(truth[key])
        if name == "rb_residual":
            entry["baseline"] = components[name].baseline_mode
        results["estimators"][name] = entry
    stds = {n: results["estimators"][n]["deltaH1"]["std"] for n in estimators}
    if "naive" in stds and "rb_residual" in stds and stds["naive"] is not None and stds["rb_residual"]:
        results["std_ratio_naive_over_rb"] = stds["naive"] / stds["rb_residual"]
    out_dir = Path(str(cfg.run.output_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    results["json_path"] = str(out_dir / "probe_results.json")
    Path(results["json_path"]).write_text(json.dumps(results, indent=2))
    print(format_table(results))
    return results


def _fmt(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.3e}" if signed else f"{value:.3e}"


def format_table(results: dict[str, Any]) -> str:
    """Human-readable summary of ``run_probe_job``'s results."""
    cfg = results["config"]
    t = results["timing_median_s"]
    lines = [
        f"entropy probe: {results['model']} on {results['device']}, B_E={cfg['batch']['B_E']} "
        f"B_U={cfg['batch']['B_U']} G={cfg['batch']['G']}, repeats={cfg['run']['repeats']}, "
        f"optimizer={cfg['optimizer']['name']} lr={results['lr']:g} (P={results['preconditioner']}, "
        f"{results['params_without_state']}/{results['params']} params without state), "
        f"mean reward on U={results['mean_reward_U']:.2f}",
        f"{'estimator':<24}{'dH1 mean':>12}{'dH1 std':>12}{'dH_true mean':>14}{'X s/batch':>11}  units",
    ]
    for name, entry in results["estimators"].items():
        label = name if name == "naive" else f"{name} ({entry.get('baseline')})"
        true_mean = entry["deltaH_true"]["mean"] if "deltaH_true" in entry else None
        lines.append(
            f"{label:<24}{_fmt(entry['deltaH1']['mean']):>12}{_fmt(entry['deltaH1']['std'], signed=False):>12}"
            f"{_fmt(true_mean):>14}{t[f'X_s[{name}]']:>11.2f}  {entry['units']}"
        )
    if "std_ratio_naive_over_rb" in results:
        lines.append(f"spread ratio std(naive)/std(rb_residual) = {results['std_ratio_naive_over_rb']:.2f}")
    lines.append(
        "time per phase (median s): " + ", ".join(f"{k}={v:.2f}" for k, v in t.items() if not k.startswith("X_s["))
    )
    lines.append(
        f"Cui et al. covariance estimate -lr*Cov(log pi, A) on U: {_fmt(statistics.fmean(results['cui_covariance_deltaH']))} nats per token"
    )
    lines.append(f"results: {results['json_path']}")
    return "\n".join(lines)
