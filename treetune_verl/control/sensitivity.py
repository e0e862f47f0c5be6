# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The controller's ``b``: how much E's token entropy moves per unit of the entropy step's coefficient, and that step.

At verl's first optimizer step of an update (the forecast's seam, ``forecast/live.py``), with the step taken and the
forecast's copy of θ′ at hand (``WeightsAroundStep`` after ``swap``):

1. E's prompts are split in two halves (even and odd prompt indices: :func:`split_halves`);
2. ``∇H_A``: one backward of the mean token entropy of half A's responses at fixed states (the pathwise gradient,
   what verl's ``entropy_coeff`` bonus ascends on its batch), :func:`token_entropy_gradient`;
3. the entropy step ``Δθ_H = k ⊙ ∇H_A`` (``adam_sensitivity.step_sensitivity``: the optimizer's step differentiated
   with respect to the coefficient);
4. ``b = ⟨∇H_B, Δθ_H⟩`` on the other half, from a central difference of two forwards of half B at θ′ ± ε Δθ_H
   (ε: ``‖ε Δθ_H‖ = ‖Δθ‖``, the step's own size, where the forecast's central difference is accurate), with its
   standard error over B's responses (a pooled ratio: ``token_entropy.ratio_and_se``);
5. once the rule has a coefficient ``c₀`` from it, the secant over that very step (:func:`secant`: one forward of half
   B at θ′ + c₀ Δθ_H). The entropy step can be many times verl's (27× on the test's tiny E, whose half A is 2
   prompts), where the slope at θ′ missed the change by 14 %; the secant is the change itself, per unit.

Why two halves: ``⟨∇H_E, P ∇H_E⟩`` from one sample is biased upward by the sampling noise of ``∇H_E`` (its trace
``tr(P Σ)``); with the step from half A and the derivative on half B the estimate is unbiased for the step actually
applied (``Δθ_H`` from A), which is what ``c · b`` must predict. It is evaluated at θ′ rather than θ (a difference of
second order, like the forecast's own).

Shapes: B = prompts of E on this rank, G = responses per prompt; the gradient and ``Δθ_H`` per parameter name, like
its local shard (FSDP2: under FSDP the backward's gradient is the mean over ranks of each rank's). Units: ``b`` in
nats per token per unit coefficient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from treetune_verl.forecast.directional import token_values
from treetune_verl.forecast.sharding import local_tensor
from treetune_verl.forecast.step_weights import WeightsAroundStep
from treetune_verl.forecast.token_entropy import ratio_and_se, ratio_moments, response_sums
from treetune_verl.probe.batch import validate_probe_batch
from treetune_verl.probe.components import ProbeComponents


@dataclass(frozen=True)
class Sensitivity:
    """One update's entropy step and what it does to E's token entropy."""

    b: float  # nats per token per unit coefficient (half B, at θ′)
    b_se: float  # its standard error over half B's responses (nan with fewer than two)
    entropy_step: dict[str, torch.Tensor]  # Δθ_H per parameter name, like its local shard, float64
    scale: float  # ε of the central difference
    norm: float  # ‖Δθ_H‖ over every rank


def split_halves(E: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """E's prompts of even index (A) and of odd index (B), every key sliced along the prompt dimension."""
    B, _, _ = validate_probe_batch(E, "E_batch")
    if B < 2:
        raise ValueError(f"entropy control: E needs at least 2 prompts on each rank to split in halves, got {B}")
    return {k: v[0::2].contiguous() for k, v in E.items()}, {k: v[1::2].contiguous() for k, v in E.items()}


def token_entropy_gradient(
    components: ProbeComponents, E: dict[str, torch.Tensor], mb_size_prompts: int
) -> dict[str, torch.Tensor]:
    """``∇`` of E's mean token entropy (Σ over response tokens of H at fixed states / their count) per parameter
    name, float64, like its local shard; ``.grad`` as it was before (the probe's passes stash and restore it)."""
    _, _, P = validate_probe_batch(E, "E_batch")
    tokens = float(E["attention_masks"][..., P:].sum())
    if tokens <= 0:
        raise ValueError("entropy control: E's half has no response token")
    gradient: dict[str, torch.Tensor] = {}
    for _, tf in components.teacher_forced_microbatches(E, mb_size_prompts, True, "E_batch"):
        ((tf.entropies * tf.response_mask).sum() / tokens).backward()
        for name, p in components.named_params:
            if p.grad is not None:
                g = local_tensor(p.grad).detach().double()
                gradient[name] = gradient[name] + g if name in gradient else g.clone()
                p.grad = None
    return gradient


def _global_norm(tensors: dict[str, torch.Tensor], sum_over_ranks) -> float:
    squared = torch.tensor([sum(float(t.double().square().sum()) for t in tensors.values())], dtype=torch.float64)
    return float(sum_over_ranks(squared).sqrt())


def measure(
    components: ProbeComponents,
    E: dict[str, torch.Tensor],
    mb_size_prompts: int,
    step_sensitivity: dict[torch.Tensor, torch.Tensor],
    weights: WeightsAroundStep,
    step_norm: float,
    sum_over_ranks=lambda t: t,
) -> Sensitivity:
    """The entropy step and ``b ± b_se`` (module docstring). ``weights``: after ``swap`` (its copy holds θ′); the
    parameters are left at θ′ + ε Δθ_H's last displacement, for the caller's ``weights.restore()``.
    ``step_sensitivity``: ``adam_sensitivity.step_sensitivity`` of the step just taken; ``step_norm``: ‖Δθ‖ over every
    rank; ``sum_over_ranks``: fp64 CPU tensors summed over the ranks (identity in one process)."""
    half_a, half_b = split_halves(E)
    name_of = {p: name for name, p in components.named_params}
    weights.displace({}, 0.0)  # θ′: the gradient of the step's own weights
    gradient = token_entropy_gradient(components, half_a, mb_size_prompts)
    step = {name_of[p]: k * gradient[name_of[p]] for p, k in step_sensitivity.items() if name_of.get(p) in gradient}
    norm = _global_norm(step, sum_over_ranks)
    if norm == 0.0 or not math.isfinite(norm) or step_norm <= 0.0:
        # no entropy step (a first Adam step responds to no gradient's size): nothing to measure, the rule falls back
        return Sensitivity(0.0, 0.0, step, 0.0, norm)
    scale = step_norm / norm
    sums = []
    for sign in (1.0, -1.0):
        weights.displace(step, sign * scale)
        tokens, entropy = response_sums(token_values(components, half_b, mb_size_prompts))
        sums.append(entropy)
    change = (sums[0] - sums[1]) / (2.0 * scale)  # [B/2, G]: per response, d Σ_k H_k / dc
    b, b_se = ratio_and_se(sum_over_ranks(ratio_moments(change, tokens)))
    return Sensitivity(b, b_se, step, scale, norm)


def secant(
    components: ProbeComponents,
    E: dict[str, torch.Tensor],
    mb_size_prompts: int,
    entropy_step: dict[str, torch.Tensor],
    coefficient: float,
    weights: WeightsAroundStep,
    at_prime: tuple[torch.Tensor, torch.Tensor],
    sum_over_ranks=lambda t: t,
) -> tuple[float, float]:
    """``(H_B(θ′ + c Δθ_H) − H_B(θ′)) / c`` on half B (one forward at θ′ + c Δθ_H) and its standard error over B's
    responses: the entropy step's effect per unit coefficient over exactly the step the rule is about to take (its
    curvature included; the central difference of :func:`measure` is the slope at θ′). ``at_prime``: half B's
    per-response ``(tokens, Σ_k H_k)`` at θ′ (the forecast's forward there); ``weights``: a copy of θ′."""
    _, half_b = split_halves(E)
    weights.displace(entropy_step, coefficient)
    _, entropy = response_sums(token_values(components, half_b, mb_size_prompts))
    tokens, before = at_prime
    return ratio_and_se(sum_over_ranks(ratio_moments((entropy.flatten() - before) / coefficient, tokens)))
