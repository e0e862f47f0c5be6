# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""⟨X_b, Δθ⟩ for every X estimator and every prompt of E: from three forwards (float32), or by backward passes (below).

Shape notation (this rank): B = prompts of E, G = responses per prompt, R = response columns.

Every X surrogate ``L`` of the probe (``probe/estimators.py``) depends on θ only through the per-token
log-probabilities ``lp[b, g, j]`` and entropies ``H[b, g, j]`` of E's responses, with its other coefficients
detached at θ. By the chain rule, for each prompt b

    ⟨X_b, Δθ⟩ = Σ_{g,j} ∂L/∂lp[b,g,j] · ⟨∇lp[b,g,j], Δθ⟩ + ∂L/∂H[b,g,j] · ⟨∇H[b,g,j], Δθ⟩

where ``∂L/∂lp``, ``∂L/∂H`` come from autograd on the surrogate built from token values (``[B, G, R]``, no model in
the graph), and the per-token directional derivatives along the step from a central difference of two forwards:

    ⟨∇f, Δθ⟩ ≈ (f(θ + Δθ) − f(θ − Δθ)) / 2,   error O(‖Δθ‖³) (exact for f quadratic in θ)

θ + Δθ = θ′ is where the optimizer's step put the weights, so that forward also gives the realised change after the
step. Three forwards over E (θ′, θ, θ − Δθ) replace a forward with graph and one backward per estimator and per prompt
(forward-mode autodiff would be exact, but verl's attention kernels, flash-attention and torch's SDPA, have no
forward-mode derivative). Measured on SmolLM2-135M, AdamW lr 1e-6 (step norm 6.3e-3): within 0.3 % of the exact
inner products per prompt, the float32 rounding of the forwards included
(``treetune_tests/treetune_verl/forecast/bench_directional_accuracy.py``; ``test_directional_on_cpu.py`` checks the
central difference against forward-mode autodiff).

Only in float32: with bf16 compute (FSDP2 mixed precision, verl's default ``param_dtype`` on GPU) most elements of a
small step are below bf16's resolution, θ ± Δθ round to θ or jump by one bf16 unit, and the difference measures
those rounding flips (the same benchmark with ``--precision bf16``: 10–30× off per prompt). There the backward method is used (``live.use_backward``):
per prompt one forward with graph and one backward per estimator, ⟨.grad, Δθ⟩ (``x_directional_derivatives_by_backward``;
the first version of the forecast, exact for the model as it computes).

Policy: temperature only (top-p = 1): a nucleus cut is not differentiable, and verl's actor computes its
log-probabilities and entropies over the whole vocabulary too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from treetune_verl.forecast.sharding import local_tensor
from treetune_verl.probe.batch import validate_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.teacher_forcing import TeacherForced


@torch.no_grad()
def token_values(
    components: ProbeComponents, E: dict[str, torch.Tensor], mb_size_prompts: int, keep_log_probs: bool = False
) -> TeacherForced:
    """Per-token log-probabilities and entropies of E's responses at the current weights: ``[B, G, R]`` fp64 CPU
    (nats, 0 at padding), in microbatches of ``mb_size_prompts`` prompts, no graph; each prompt computed once for its
    G responses (``teacher_force``'s ``share_prompt``). ``keep_log_probs``: with the vocabulary's log-probabilities
    at E's T response tokens, ``[T, V]`` fp32 CPU (``softmax_tangent.py``)."""
    microbatches = components.teacher_forced_microbatches(
        E, mb_size_prompts, True, "E_batch", share_prompt=True, keep_log_probs=keep_log_probs
    )
    return _joined([tf for _, tf in microbatches])


def _joined(parts: list[TeacherForced]) -> TeacherForced:
    """Microbatches' token values joined along the prompt dimension, detached, fp64 on CPU (mask bool)."""
    kept = [tf.log_probs for tf in parts if tf.log_probs is not None]
    return TeacherForced(
        torch.cat([tf.token_logprobs.detach().double().cpu() for tf in parts]),
        torch.cat([tf.entropies.detach().double().cpu() for tf in parts]),
        torch.cat([tf.response_mask.cpu() for tf in parts]),
        (kept[0] if len(kept) == 1 else torch.cat(kept)) if kept else None,
    )


def sequence_sums(values: TeacherForced) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S, F)``: ``[B, G]`` sequence log-probabilities and summed entropies (nats), as ``ground_truth`` uses them."""
    return values.token_logprobs.sum(-1), values.entropies.sum(-1)


def x_directional_derivatives(
    components: dict[str, ProbeComponents],
    E: dict[str, torch.Tensor],
    at_theta: TeacherForced,
    plus: TeacherForced,
    minus: TeacherForced,
) -> dict[str, torch.Tensor]:
    """Per prompt of E, ⟨X_b, Δθ⟩ for each estimator (``[B]`` fp64; nats per budget token when the estimator
    normalises by L_max), from the token values at θ, θ + Δθ and θ − Δθ.

    Each estimator's surrogate is built once over all of E from the values at θ (``residual_mu`` reads its baseline
    before and folds E's residuals in after, as one probe batch does).
    """
    return dots_from_coefficients(x_coefficients(components, E, at_theta), plus, minus)


def dots_from_coefficients(
    coefficients: dict[str, tuple[torch.Tensor, torch.Tensor]], plus: TeacherForced, minus: TeacherForced
) -> dict[str, torch.Tensor]:
    """Per estimator, ⟨X_b, Δθ⟩ ``[B]`` from its ``(∂L/∂lp, ∂L/∂H)`` (:func:`x_coefficients`) and the central
    differences of the token values at θ + Δθ and θ − Δθ."""
    tangent_lp = (plus.token_logprobs - minus.token_logprobs) / 2  # [B, G, R] ⟨∇lp, Δθ⟩
    tangent_h = (plus.entropies - minus.entropies) / 2  # [B, G, R] ⟨∇H, Δθ⟩
    return {e: (d_lp * tangent_lp + d_h * tangent_h).sum(dim=(1, 2)) for e, (d_lp, d_h) in coefficients.items()}


def x_coefficients(
    components: dict[str, ProbeComponents], E: dict[str, torch.Tensor], at_theta: TeacherForced
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per estimator, ``(∂L/∂lp, ∂L/∂H)`` ``[B, G, R]`` fp64 of its X surrogate L at the token values at θ (zeros where
    L does not read the values), so that ⟨X_b, Δθ⟩ = Σ_{g,j} ∂L/∂lp · ⟨∇lp, Δθ⟩ + ∂L/∂H · ⟨∇H, Δθ⟩.

    Each estimator's surrogate is built once over all of E (``residual_mu`` reads its baseline before and folds E's
    residuals in after, as one probe batch does).
    """
    R = at_theta.token_logprobs.shape[-1]
    out = {}
    for estimator, comps in components.items():
        loss_fn, finish = comps.x_surrogate(R)
        lp = at_theta.token_logprobs.clone().requires_grad_()
        entropies = at_theta.entropies.clone().requires_grad_()
        with torch.enable_grad():
            loss = loss_fn({"tf": TeacherForced(lp, entropies, at_theta.response_mask), **E})
            d_lp, d_h = torch.autograd.grad(loss, [lp, entropies], allow_unused=True)
        finish()
        out[estimator] = tuple(torch.zeros_like(lp) if d is None else d.detach() for d in (d_lp, d_h))
    return out


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model's forwards compute in: FSDP2's mixed-precision ``param_dtype`` where one is set (on any
    FSDP2 module), else that of its first floating-point parameter."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            # FSDP2 keeps the policy on its module state (torch 2.13: FSDPState._mp_policy); unknown -> not fp32
            policy = getattr(module._get_fsdp_state(), "_mp_policy", None)
            param_dtype = getattr(policy, "param_dtype", torch.bfloat16) if policy is not None else torch.bfloat16
            if param_dtype is not None:
                return param_dtype
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


PATHWISE = "pathwise"  # x_directional_derivatives_by_backward's key for ⟨∇ Σ_{g,k} H_k, Δθ⟩ (E's summed entropy)


def x_directional_derivatives_by_backward(
    components: dict[str, ProbeComponents],
    E: dict[str, torch.Tensor],
    step_of: Callable[[str, torch.Tensor], torch.Tensor],
) -> tuple[dict[str, torch.Tensor], TeacherForced]:
    """Per prompt of E, ⟨X_b, Δθ⟩ over this rank's shards for each estimator (``[B]`` fp64) and, under
    :data:`PATHWISE`, ⟨∇ Σ_{g,k} H_k, Δθ⟩ of the prompt's summed token entropies at fixed states; and the token
    values at the current weights (θ), from one forward with graph per prompt and one backward per estimator and one
    for the entropies.

    ``step_of(name, shard)`` gives Δθ for a parameter's local shard. Under FSDP each backward's gradient is averaged
    over the W ranks, so the sum over ranks of these values is, per prompt index b, the mean over ranks of
    ⟨X_{r,b}, Δθ⟩. With ``residual_mu`` the baseline is read before E and updated after it, as one probe batch does.
    """
    first = next(iter(components.values()))
    B, _, P = validate_probe_batch(E, "E_batch")
    surrogates = {e: c.x_surrogate(E["sequences"].shape[-1] - P) for e, c in components.items()}
    surrogates[PATHWISE] = (lambda mb: (mb["tf"].entropies * mb["tf"].response_mask).sum(), lambda: None)
    dots = {e: torch.zeros(B, dtype=torch.float64) for e in surrogates}
    parts = []
    for b in range(B):
        prompt = {key: value[b : b + 1] for key, value in E.items()}
        for mb, tf in first.teacher_forced_microbatches(prompt, 1, True, "E_batch"):
            for j, (estimator, (loss_fn, _)) in enumerate(surrogates.items()):
                loss_fn({"tf": tf, **mb}).backward(retain_graph=j < len(surrogates) - 1)
                dots[estimator][b] = _grad_dot(first, step_of)
                for p in first.params:
                    p.grad = None
            parts.append(_joined([tf]))  # detached: no graph kept past its prompt
    for _, finish in surrogates.values():
        finish()
    return dots, _joined(parts)


def _grad_dot(components: ProbeComponents, step_of: Callable[[str, torch.Tensor], torch.Tensor]) -> float:
    """⟨.grad, Δθ⟩ over this rank's shards (fp64); parameters without a gradient add nothing."""
    total = 0.0
    for name, p in components.named_params:
        if p.grad is not None:
            step = step_of(name, local_tensor(p))
            total += float((local_tensor(p.grad).detach().double() * step.double()).sum())
    return total
