# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``run_mixed_probe``: ΔH₁ = lr · ⟨X̄, P Ȳ⟩ from an evaluation batch E and an update batch U.

    X̄ = (1/B_E) Σ_{b∈E} X_b   estimates ∇ mean_b H_seq(x_b)/L_max(x_b)  (nats per L_max token; per sequence for
                               rb_residual with rb_normalize_by_length=false)
    Ȳ = (1/B_U) Σ_{b∈U} Y_b   = ∇J, J = mean_b mean_g (A/L_max)·S  (the step minimises -J)
    P                         Adam preconditioner from the optimizer state (identity without one)

For SGD, θ′ - θ = lr·Ȳ; for Adam with β1 = 0, θ′ - θ = lr·P(Ȳ) up to the second-moment update (see
``preconditioner.py``), so ΔH₁ is the first-order change of the target entropy; ΔH₁ > 0 means the step raises it.
X̄ and Ȳ come from independent batches, so ⟨X̄, PȲ⟩ is unbiased for ⟨∇H, P ∇J_U⟩ given U.
"""

from __future__ import annotations

import logging
import time

import torch
from omegaconf import DictConfig

from treetune_verl.probe.components import ParamBuffer, ProbeComponents, is_multiprocess_ddp
from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.ground_truth import true_entropy_change
from treetune_verl.probe.preconditioner import AdamPreconditioner

logger = logging.getLogger(__name__)


def resolve_lr(config: DictConfig, optimizer: torch.optim.Optimizer | None) -> float:
    """The step's learning rate: the optimizer's (one value across groups), else ``optimizer.lr``."""
    if optimizer is None:
        return float(config.optimizer.lr)
    lrs = {float(group["lr"]) for group in optimizer.param_groups}
    if len(lrs) != 1:
        raise ValueError(f"run_mixed_probe needs one learning rate across param groups, got {sorted(lrs)}")
    return lrs.pop()


def target_units(components: ProbeComponents) -> str:
    """Units of X̄'s target, hence of ΔH₁."""
    if components.x_mode == "rb_residual" and not components.rb_normalize_by_length:
        return "nats per sequence"
    return "nats per L_max token"


def _all_reduce_if_distributed(model: torch.nn.Module, buf: ParamBuffer, count: int) -> int:
    """Sum buffers and prompt counts over DDP ranks (no-op on one process). Untested beyond world size 1."""
    if not is_multiprocess_ddp(model):
        return count
    for tensor in buf.values():
        torch.distributed.all_reduce(tensor)
    total = torch.tensor([count], dtype=torch.long, device=next(iter(buf.values())).device)
    torch.distributed.all_reduce(total)
    return int(total.item())


def buffer_norm(buf: ParamBuffer) -> float:
    return float(sum(t.double().pow(2).sum() for t in buf.values()) ** 0.5)


def run_mixed_probe(
    model: torch.nn.Module,
    E_batch: dict[str, torch.Tensor],
    U_batch: dict[str, torch.Tensor],
    config: DictConfig | dict | None,
    optimizer: torch.optim.Optimizer | None = None,
    components: ProbeComponents | None = None,
) -> dict[str, object]:
    """Estimate ΔH₁ for one optimizer step on ``U_batch``, with ∇H estimated on ``E_batch``.

    Args:
        model: HF-style causal LM (optionally DDP-wrapped).
        E_batch, U_batch: probe batches (``batch.make_probe_batch``).
        config: probe config (full or partial; ``config/probe.yaml``). ``generation.temperature``/``top_p`` must be
            the policy E and U were sampled with: teacher forcing rebuilds exactly that policy, and a mismatch is
            only detected when a sampled token falls outside the nucleus.
        optimizer: the optimizer whose next step is probed (Adam/AdamW state → P; anything else → identity). With
            ``ground_truth.enable`` its step is taken and undone; without one, SGD(``optimizer.lr``) is used.
        components: reuse a ``ProbeComponents`` across calls (keeps the ``residual_mu`` baseline warm).

    Returns:
        dict: ``bars_dot``, ``deltaH1``, ``B_E``, ``B_U``, ``lr``, estimator settings, ``preconditioner``,
        ``params_without_state``, ``norm_X``/``norm_Y`` (of X̄ and P Ȳ), ``target_units``, ``timing`` (seconds per
        phase) and, with ground truth, ``deltaH_true``, ``H_before``, ``H_after``, ``min_ess``.
    """
    cfg = resolve_config(config)
    start = time.perf_counter()
    comps = components if components is not None else ProbeComponents(model, cfg, optimizer)
    lr = resolve_lr(cfg, optimizer)
    mb = int(cfg.probe.mb_size_prompts)

    sum_X, B_E = comps.accumulate_sum_X(E_batch, mb)
    timing = dict(comps.last_timing)
    B_E = _all_reduce_if_distributed(model, sum_X, B_E)
    preconditioner = AdamPreconditioner(optimizer, comps.params)
    sum_Y, B_U = comps.accumulate_sum_Y(U_batch, mb, preconditioner)
    timing.update(comps.last_timing)
    B_U = _all_reduce_if_distributed(model, sum_Y, B_U)

    dot_start = time.perf_counter()
    mean_X = comps.scale_buffer(sum_X, 1.0 / max(B_E, 1))
    mean_Y = comps.scale_buffer(sum_Y, 1.0 / max(B_U, 1))
    bars_dot = comps.dot_param_buffers(mean_X, mean_Y)
    timing["dot_s"] = time.perf_counter() - dot_start
    result: dict[str, object] = {
        "bars_dot": bars_dot,
        "deltaH1": lr * bars_dot,
        "B_E": B_E,
        "B_U": B_U,
        "lr": lr,
        "x_estimator_mode": comps.x_mode,
        "baseline_mode": comps.baseline_mode if comps.x_mode == "rb_residual" else "leave_one_out",
        "weighting_mode": comps.weighting_mode if comps.x_mode == "naive" else None,
        "rb_normalize_by_length": comps.rb_normalize_by_length if comps.x_mode == "rb_residual" else None,
        "target_units": target_units(comps),
        "norm_X": buffer_norm(mean_X),
        "norm_Y": buffer_norm(mean_Y),
        **preconditioner.describe(),
    }
    if cfg.ground_truth.enable:
        if is_multiprocess_ddp(model):
            raise NotImplementedError("ground_truth.enable is not supported under multi-process DDP")
        truth = true_entropy_change(comps, [E_batch], U_batch, mb, optimizer, lr)
        per_sequence = result["target_units"] == "nats per sequence"
        result["deltaH_true"] = truth["deltaH_true_per_sequence" if per_sequence else "deltaH_true"][0]
        result["H_before"] = truth["H_before"][0]
        result["H_after"] = truth["H_after"][0]
        result["min_ess"] = truth["min_ess"][0]
        timing["ground_truth_s"] = truth["ground_truth_s"]
        timing["train_step_s"] = truth["train_step_s"]
    timing["total_s"] = time.perf_counter() - start
    result["timing"] = timing

    logger.info(
        "mixed probe [%s, baseline=%s, P=%s]: B_E=%d B_U=%d bars_dot=%.10f deltaH1=%.10f%s",
        comps.x_mode,
        result["baseline_mode"],
        result["preconditioner"],
        B_E,
        B_U,
        bars_dot,
        result["deltaH1"],
        f" deltaH_true={result['deltaH_true']:.10f}" if "deltaH_true" in result else "",
    )
    return result
