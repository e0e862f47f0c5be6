# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast of E's token entropy: the mean entropy of the policy's next-token distribution over the states E's
responses visit, its first-order change along the update's step, and the realised change at the same states.

Shape notation (this rank): B = prompts of E, G = responses per prompt, R = response columns; N = B·G responses.
Units: nats per token.

    H_tok(θ)  = Σ_{b,g,k} H_θ(s_bgk) / Σ_{b,g} L_bg          the token-mean entropy at E's states s_bgk (pooled over
                                                             every response token of every rank's E, as verl's
                                                             ``actor/entropy`` and our ``rollout_entropy/mean`` pool a
                                                             batch's tokens)
    ΔH₁_tok   = Σ ⟨∇H_θ(s_bgk), Δθ⟩ / Σ L                     the forecast: its tangent along Δθ (central difference
                                                             of the forwards at θ ± Δθ, ``directional.py``)
    realised  = Σ [H_θ′(s_bgk) − H_θ(s_bgk)] / Σ L           exact at the same states (no importance weights)

Why this quantity (measured on a collapsing SmolLM2 GRPO run, ``treetune_specs/2026-11-28-forecast-calibration.md``):
the sequence-level ΔH₁ of the probe's estimators (``naive``, ``rb_residual``) carries a score-function term whose
standard error at E = 4 prompts × 2 responses is 10-100× the change it estimates, and the importance-weighted
realised change of H_seq weighs whole sequences by exp(S_θ′ − S_θ), with |S_θ′ − S_θ| of 1-4 nats per sequence at
Adam's steps there: both are noise. The pathwise part, the entropy change at fixed states, has no score function;
it is the quantity of Cui et al. (2025)'s entropy dynamics (the change of H(π(·|s)) at the states the policy visits)
and of verl's ``actor/entropy``. What it leaves out is the change of which states the policy visits; the spec
measures that part against many fresh samples under both weights.

``deltaH1_on_policy`` adds the change of which states are visited, to first order (``shift_term``): unbiased for the
change of the entropy the next rollout samples with, and as noisy as score-function estimates are at small E.

Standard errors are over the N responses of every rank (independent samples given E's prompts), by the
ratio-estimator (delta-method) formula; the realised change and the forecast are paired (the same states), so their
difference has its own standard error (``error_se``), the one their agreement is judged by.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from treetune_verl.probe.teacher_forcing import TeacherForced

# The moments a pooled ratio Σx / Σc needs, summed over the responses of every rank.
_MOMENTS = 6  # n, Σx, Σc, Σx², Σc², Σxc


def ratio_moments(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``[6]`` fp64: n, Σx, Σc, Σx², Σc², Σx·c over the ``[N]`` per-response numerators ``x`` and counts ``c``."""
    x, c = x.double().flatten(), c.double().flatten()
    return torch.stack(
        [
            torch.tensor(float(len(x)), dtype=torch.float64),
            x.sum(),
            c.sum(),
            (x * x).sum(),
            (c * c).sum(),
            (x * c).sum(),
        ]
    )


def ratio_and_se(moments: torch.Tensor) -> tuple[float, float]:
    """The pooled ratio r = Σx / Σc and its standard error over the responses (delta method,
    SE² = Σ(x_i − r c_i)² / (n (n − 1) c̄²)); SE nan for fewer than two responses, both nan without tokens."""
    n, sx, sc, sxx, scc, sxc = (float(v) for v in moments)
    if sc <= 0:
        return math.nan, math.nan
    r = sx / sc
    if n < 2:
        return r, math.nan
    residual_ss = max(sxx - 2 * r * sxc + r * r * scc, 0.0)
    return r, math.sqrt(residual_ss / (n * (n - 1))) / (sc / n)


def shift_term(at_theta: TeacherForced, tangent_lp: torch.Tensor) -> torch.Tensor:
    """``[B, G]``: per response, Σ_j ⟨∇log π(y_j|s_j), Δθ⟩ · Σ_{k>j} (H_k − H̄_b), the score-function part of the
    first-order change of the prompt's on-policy token entropy H_tok = E[Σ_k H_k] / E[L] (H̄_b: the prompt's pooled
    token entropy at θ; the ratio's derivative (∇E[F] − H_tok ∇E[L]) / E[L] makes each later token count by its
    entropy above the mean). Unbiased with the pathwise tangent (to first order), but a score-function estimate: at
    E = 4 prompts × 2 responses its standard error is several times the change (the spec)."""
    mask = at_theta.response_mask.double()
    h = at_theta.entropies.double() * mask
    mean = h.sum((1, 2), keepdim=True) / mask.sum((1, 2), keepdim=True).clamp(min=1)  # [B, 1, 1]
    centred = (h - mean) * mask
    later = centred.flip(-1).cumsum(-1).flip(-1) - centred  # Σ_{k>j}
    return (tangent_lp * later * mask).sum(-1)


def response_sums(values: TeacherForced) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, entropy)``: ``[B, G]`` fp64 token counts and entropies summed over each response's tokens."""
    mask = values.response_mask.double()
    return mask.sum(-1), (values.entropies.double() * mask).sum(-1)


@dataclass(frozen=True)
class TokenEntropyStats:
    """Per-unit sums of one forecast, ``[U]`` fp64 (a unit: a response of this rank, or with backward passes a prompt
    index summed over the ranks): token counts, entropy at θ, the tangent ⟨∇Σ_k H_k, Δθ⟩ and the realised change
    after the first optimizer step (nats summed over the unit's tokens)."""

    tokens: torch.Tensor
    h_before: torch.Tensor
    tangent: torch.Tensor
    first_step: torch.Tensor
    shift: torch.Tensor | None = None  # the score-function term of the on-policy change (central differences only)
    first_half: torch.Tensor | None = None  # bool: the unit is among the first ⌊G/2⌋ responses of its prompt
    softmax: torch.Tensor | None = None  # Σ_k H_soft(s_k) − H_θ(s_k), the forecast exact in the softmax

    @classmethod
    def per_response(
        cls,
        at_theta: TeacherForced,
        plus: TeacherForced,
        minus: TeacherForced,
        softmax_change: torch.Tensor | None = None,
    ) -> TokenEntropyStats:
        """Units = this rank's responses; the tangent by the central difference of the values at θ ± Δθ, and the
        shift term :func:`shift_term`; with ``softmax_change`` (``[B, G, R]`` H_soft − H_θ per token,
        ``softmax_tangent.py``) the forecast exact in the softmax."""
        tokens, h0 = response_sums(at_theta)
        mask = at_theta.response_mask.double()
        _, h_plus = response_sums(plus)
        _, h_minus = response_sums(minus)
        tangent_lp = (plus.token_logprobs.double() - minus.token_logprobs.double()) / 2
        B, G = tokens.shape
        return cls(
            tokens.flatten(),
            h0.flatten(),
            ((h_plus - h_minus) / 2).flatten(),
            (h_plus - h0).flatten(),
            shift_term(at_theta, tangent_lp).flatten(),
            (torch.arange(G) < G // 2).repeat(B) if G >= 2 else None,
            None if softmax_change is None else (softmax_change.double() * mask).sum(-1).flatten(),
        )

    def metrics(
        self, prefix: str, whole_update: torch.Tensor | None, reduce: Callable[[torch.Tensor], torch.Tensor]
    ) -> dict[str, float]:
        """``<prefix>{H_before, deltaH1(_se), deltaH_realised_first_step(_se), deltaH_realised(_se), error_se}``;
        with the shift term, ``deltaH1_on_policy(_se)``: the tangent plus the shift, the first-order change of the
        on-policy token entropy (the states' distribution moving too); with halves, ``holdout/deltaH1(_se)`` over
        the first ⌊G/2⌋ responses of every prompt and ``holdout/deltaH_realised_first_step(_se)`` over the others:
        a forecast and a realised change of the same quantity from independent samples, whose combined standard
        error √(SE_f² + SE_r²) is the right one to judge their agreement by. With the forecast exact in the softmax,
        ``deltaH_softmax(_se)``, ``softmax_error_se`` (paired) and ``holdout/deltaH_softmax(_se)`` likewise.

        Args:
            whole_update: per unit, the entropy change after the whole update when it took more than one optimizer
                step (None: the first step's).
            reduce: sums a tensor over the ranks (identity when the units already hold every rank's values).
        """
        parts = {
            "H_before": self.h_before,
            "deltaH1": self.tangent,
            "deltaH_realised_first_step": self.first_step,
            "deltaH_realised": self.first_step if whole_update is None else whole_update,
            "error": self.first_step - self.tangent,  # realised − forecast at the same states: paired
        }
        if self.shift is not None:
            parts["deltaH1_on_policy"] = self.tangent + self.shift
        if self.softmax is not None:
            parts["deltaH_softmax"] = self.softmax
            parts["softmax_error"] = self.first_step - self.softmax
        units = {name: self.tokens for name in parts}
        if self.first_half is not None:  # held out: the forecast of one half of the responses, realised on the other
            first, second = self.first_half, ~self.first_half
            parts["holdout/deltaH1"] = self.tangent[first]
            parts["holdout/deltaH_realised_first_step"] = self.first_step[second]
            units["holdout/deltaH1"], units["holdout/deltaH_realised_first_step"] = (
                self.tokens[first],
                self.tokens[second],
            )
            if self.softmax is not None:
                parts["holdout/deltaH_softmax"], units["holdout/deltaH_softmax"] = (
                    self.softmax[first],
                    self.tokens[first],
                )
        moments = reduce(torch.stack([ratio_moments(x, units[name]) for name, x in parts.items()]))
        out = {}
        for name, m in zip(parts, moments, strict=True):
            value, se = ratio_and_se(m)
            if not name.endswith("error"):
                out[prefix + name] = value
            if name != "H_before" and math.isfinite(se):
                out[prefix + name + "_se"] = se
        return out
