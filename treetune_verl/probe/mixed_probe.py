# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``run_mixed_probe``: ΔH₁ = ⟨X̄, Δθ⟩ from an evaluation batch E and an update batch U, and its pieces.

    X̄ = (1/B_E) Σ_{b∈E} X_b   estimates ∇ mean_b H_seq(x_b)/L_max(x_b)  (nats per L_max token; per sequence for
                               rb_residual with rb_normalize_by_length=false)
    Ȳ = (1/B_U) Σ_{b∈U} Y_b   = ∇J, J = mean_b mean_g (A/L_max)·S  (the step minimises -J)
    Δθ                        the optimizer's own next step from the gradient -Ȳ at its current state
                              (``optimizer_step.py``: any torch optimizer, exact); ``probe.preconditioner=identity``
                              or no optimizer: lr·Ȳ

ΔH₁ is the first-order change of the target entropy; ΔH₁ > 0 means the step raises it. X̄ and Ȳ come from
independent batches and Δθ is a function of Ȳ alone, so ⟨X̄, Δθ⟩ is unbiased for ⟨∇H, Δθ⟩ given U. The code keeps
Δθ / lr and multiplies by lr (so ``bars_dot`` = ⟨X̄, Δθ/lr⟩ stays comparable across learning rates).

Pieces (``run_mixed_probe`` is built from them; the main job reuses one ``estimate_mean_Y`` per U batch across E
batches and estimators, and one ground-truth step across E batches, through ``run_mixed_probe``'s keyword extras):
``estimate_mean_X`` → X̄, ``estimate_mean_Y`` → Δθ/lr, ``predict_deltaH1`` → ⟨X̄, Δθ/lr⟩ and ΔH₁.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from treetune_verl.probe.components import ParamBuffer, ProbeComponents, is_multiprocess_ddp
from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.ground_truth import true_entropy_change, truth_of_batch
from treetune_verl.probe.optimizer_step import optimizer_step, params_without_state

logger = logging.getLogger(__name__)


def resolve_lr(config: DictConfig, optimizer: torch.optim.Optimizer | None) -> float:
    """The step's learning rate: the optimizer's (one value across groups), else ``optimizer.lr``."""
    if optimizer is None:
        return float(config.optimizer.lr)
    return _single_lr(optimizer)


def _single_lr(optimizer: torch.optim.Optimizer) -> float:
    lrs = {float(group["lr"]) for group in optimizer.param_groups}
    if len(lrs) != 1:
        raise ValueError(f"run_mixed_probe needs one learning rate across param groups, got {sorted(lrs)}")
    return lrs.pop()


def target_units(components: ProbeComponents) -> str:
    """Units of X̄'s target, hence of ΔH₁."""
    if components.x_mode == "rb_residual" and not components.rb_normalize_by_length:
        return "nats per sequence"
    return "nats per L_max token"


def collective_device() -> torch.device:
    """The device the default process group's collectives take tensors on: CUDA for NCCL, else CPU (gloo).

    A mixed backend string such as ``"cpu:gloo,cuda:nccl"`` still takes CPU tensors (through gloo).
    """
    backend = str(torch.distributed.get_backend())
    if "nccl" in backend and "cpu:" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce_if_distributed(model: torch.nn.Module, buf: ParamBuffer, count: int) -> int:
    """Sum buffers (in place, on their own device) and prompt counts over DDP ranks; no-op on one process.

    Buffers live on ``probe.buffers_device`` (CPU by default), which NCCL cannot reduce: each is reduced on the
    backend's device (:func:`collective_device`) and copied back.
    """
    if not is_multiprocess_ddp(model):
        return count
    device = collective_device()
    for tensor in buf.values():
        if tensor.device == device:
            torch.distributed.all_reduce(tensor)
        else:
            on_device = tensor.to(device)
            torch.distributed.all_reduce(on_device)
            tensor.copy_(on_device)
    total = torch.tensor([count], dtype=torch.long, device=device)
    torch.distributed.all_reduce(total)
    return int(total.item())


def buffer_norm(buf: ParamBuffer) -> float:
    """Euclidean norm over every tensor of ``buf`` (fp64 accumulation)."""
    return float(sum(t.double().pow(2).sum() for t in buf.values()) ** 0.5)


@dataclass(frozen=True)
class MeanY:
    """The step direction of one U batch per unit of learning rate, Δθ / lr, reusable across E batches and estimators.

    Attributes:
        buffer: Δθ / lr keyed by parameter name, each tensor shaped like its parameter (``probe.buffers_dtype`` on
            ``probe.buffers_device``): with ``probe.preconditioner=optimizer`` Δθ is the optimizer's own next step
            from the gradient −Ȳ (``optimizer_step.py``), with ``identity`` (or no optimizer) Δθ = lr·Ȳ.
        B_U: prompts in U (summed over DDP ranks).
        preconditioner: ``{"preconditioner": "optimizer" | "identity", "optimizer": class name or None,
            "params_without_state": int, "params": int}``.
        seconds: time of the Y passes (and of the optimizer's dry-run step).
    """

    buffer: ParamBuffer
    B_U: int
    preconditioner: dict[str, object]
    seconds: float

    @functools.cached_property
    def norm(self) -> float:
        """‖Δθ / lr‖, computed once on first use (a pass over every parameter)."""
        return buffer_norm(self.buffer)


def estimate_mean_X(
    components: ProbeComponents, E_batch: dict[str, torch.Tensor], mb_size_prompts: int
) -> tuple[ParamBuffer, int]:
    """``(X̄, B_E)``: the mean over E's prompts of X_b (estimator per ``components.x_mode``), all ranks.

    X̄ is keyed by parameter name; units per ``target_units(components)`` per unit of θ. Updates the ``residual_mu``
    baseline once; ``components.last_timing["X_s"]`` holds the time of the passes.
    """
    sum_X, B_E = components.accumulate_sum_X(E_batch, mb_size_prompts)
    B_E = _all_reduce_if_distributed(components.model, sum_X, B_E)
    return components.scale_buffer(sum_X, 1.0 / max(B_E, 1)), B_E


def estimate_mean_Y(
    components: ProbeComponents,
    U_batch: dict[str, torch.Tensor],
    mb_size_prompts: int,
    optimizer: torch.optim.Optimizer | None,
) -> MeanY:
    """Δθ / lr for U's prompts, all ranks: Ȳ, then the optimizer's own next step from −Ȳ at its state now.

    ``probe.preconditioner=identity`` or no optimizer: Δθ / lr = Ȳ (plain SGD).
    """
    start = time.perf_counter()
    sum_Y, B_U = components.accumulate_sum_Y(U_batch, mb_size_prompts)
    B_U = _all_reduce_if_distributed(components.model, sum_Y, B_U)
    mean_Y = components.scale_buffer(sum_Y, 1.0 / max(B_U, 1))
    params = len(components.params)
    description: dict[str, object] = {"preconditioner": "identity", "optimizer": None, "params_without_state": params}
    if optimizer is not None and components.preconditioner == "optimizer":
        lr = _single_lr(optimizer)
        description = {
            "preconditioner": "optimizer",
            "optimizer": type(optimizer).__name__,
            "params_without_state": params_without_state(optimizer, components.params),
        }
        negative = components.scale_buffer(mean_Y, -1.0)  # the loss is -J: its gradient is -Ȳ
        step = optimizer_step(
            optimizer, components.named_params, negative, components.buffers_dtype, components.buffers_device
        )
        mean_Y = components.scale_buffer(step, 1.0 / lr)
    description["params"] = params
    return MeanY(mean_Y, B_U, description, time.perf_counter() - start)


def predict_deltaH1(mean_X: ParamBuffer, mean_Y: MeanY, lr: float) -> tuple[float, float]:
    """``(bars_dot, deltaH1)``: ⟨X̄, Δθ/lr⟩ (fp64) and ΔH₁ = lr · ⟨X̄, Δθ/lr⟩ = ⟨X̄, Δθ⟩ in X̄'s target units (nats)."""
    bars_dot = ProbeComponents.dot_param_buffers(mean_X, mean_Y.buffer)
    return bars_dot, lr * bars_dot


def run_mixed_probe(
    model: torch.nn.Module,
    E_batch: dict[str, torch.Tensor],
    U_batch: dict[str, torch.Tensor],
    config: DictConfig | dict | None,
    optimizer: torch.optim.Optimizer | None = None,
    components: ProbeComponents | None = None,
    *,
    mean_Y: MeanY | None = None,
    ground_truth: Mapping[str, float] | None = None,
    log_level: int = logging.INFO,
) -> dict[str, object]:
    """Estimate ΔH₁ for one optimizer step on ``U_batch``, with ∇H estimated on ``E_batch``.

    Args:
        model: HF-style causal LM (optionally DDP-wrapped).
        E_batch, U_batch: probe batches (``batch.make_probe_batch``).
        config: probe config (full or partial; ``config/probe.yaml``). ``generation.temperature``/``top_p`` must be
            the policy E and U were sampled with: teacher forcing rebuilds exactly that policy, and a mismatch is
            only detected when a sampled token falls outside the nucleus.
        optimizer: the optimizer whose next step is probed: Δθ is its own step from −Ȳ at its current state (any
            ``torch.optim`` optimizer; ``probe.preconditioner=identity``: lr·Ȳ). With ``ground_truth.enable`` its
            step is taken and undone; without one, SGD(``optimizer.lr``) is used.
        components: reuse a ``ProbeComponents`` across calls (keeps the ``residual_mu`` baseline warm).
        mean_Y: ``estimate_mean_Y`` of ``U_batch`` already taken (same optimizer state): the Y passes are skipped.
        ground_truth: ``ground_truth.truth_of_batch`` of U's step measured on ``E_batch``: used instead of taking
            the step again (with or without ``ground_truth.enable``).
        log_level: level of the one-line summary (the main job logs it at DEBUG, beside its table).

    Returns:
        dict: ``bars_dot``, ``deltaH1``, ``B_E``, ``B_U``, ``lr``, estimator settings, ``preconditioner``
        (``optimizer`` | ``identity``), ``optimizer`` (class name), ``params_without_state``, ``step_norm`` (‖Δθ‖),
        ``norm_X``/``norm_Y`` (of X̄ and Δθ/lr), ``target_units``, ``timing`` (seconds per
        phase this call ran) and, with ground truth, ``deltaH_true`` (in ``target_units``), ``H_before``,
        ``H_after``, ``min_ess``.
    """
    cfg = resolve_config(config)
    start = time.perf_counter()
    comps = components if components is not None else ProbeComponents(model, cfg, optimizer)
    lr = resolve_lr(cfg, optimizer)
    mb = int(cfg.probe.mb_size_prompts)

    mean_X, B_E = estimate_mean_X(comps, E_batch, mb)
    timing = dict(comps.last_timing)
    if mean_Y is None:
        mean_Y = estimate_mean_Y(comps, U_batch, mb, optimizer)
        timing["Y_s"] = mean_Y.seconds
    dot_start = time.perf_counter()
    bars_dot, deltaH1 = predict_deltaH1(mean_X, mean_Y, lr)
    timing["dot_s"] = time.perf_counter() - dot_start
    result: dict[str, object] = {
        "bars_dot": bars_dot,
        "deltaH1": deltaH1,
        "B_E": B_E,
        "B_U": mean_Y.B_U,
        "lr": lr,
        "x_estimator_mode": comps.x_mode,
        "baseline_mode": comps.baseline_mode if comps.x_mode == "rb_residual" else "leave_one_out",
        "weighting_mode": comps.weighting_mode if comps.x_mode == "naive" else None,
        "rb_normalize_by_length": comps.rb_normalize_by_length if comps.x_mode == "rb_residual" else None,
        "target_units": target_units(comps),
        "norm_X": buffer_norm(mean_X),
        "norm_Y": mean_Y.norm,
        "step_norm": lr * mean_Y.norm,  # ‖Δθ‖
        **mean_Y.preconditioner,
    }
    if ground_truth is None and cfg.ground_truth.enable:
        if is_multiprocess_ddp(model):
            raise NotImplementedError("ground_truth.enable is not supported under multi-process DDP")
        measured = true_entropy_change(comps, [E_batch], U_batch, mb, optimizer, lr)
        ground_truth = truth_of_batch(measured, 0)
        timing["ground_truth_s"] = measured["ground_truth_s"]
        timing["train_step_s"] = measured["train_step_s"]
    if ground_truth is not None:
        per_sequence = result["target_units"] == "nats per sequence"
        result["deltaH_true"] = ground_truth["deltaH_true_per_sequence" if per_sequence else "deltaH_true"]
        for key in ("H_before", "H_after", "min_ess"):
            result[key] = ground_truth[key]
    timing["total_s"] = time.perf_counter() - start
    result["timing"] = timing

    logger.log(
        log_level,
        "mixed probe [%s, baseline=%s, P=%s]: B_E=%d B_U=%d bars_dot=%.10f deltaH1=%.10f%s",
        comps.x_mode,
        result["baseline_mode"],
        result["preconditioner"],
        B_E,
        mean_Y.B_U,
        bars_dot,
        deltaH1,
        f" deltaH_true={result['deltaH_true']:.10f}" if "deltaH_true" in result else "",
    )
    return result
