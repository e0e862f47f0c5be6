# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast exact in the softmax: E's per-token entropies with the logits moved along their tangent.

Shape notation: T = E's response tokens (every real token of every response, in ``response_mask.nonzero()`` order),
V = vocabulary size. Units: nats.

    H_soft(s) = H(softmax(ℓ_θ(s) + ℓ̇(s))),   ℓ̇(s) = (ℓ_θ+Δθ(s) − ℓ_θ−Δθ(s)) / 2 = ⟨∇ℓ(s), Δθ⟩ + O(‖Δθ‖³)

ℓ: the policy's log-probabilities over the vocabulary (tempered; the softmax ignores a shift per state, so
log-probabilities and logits give the same H_soft). ΔH₁ (``token_entropy.py``) is H's tangent, first order in the
weights *and* in the softmax; H_soft keeps the first of those (the network's logits linear along the step: the same
information as ΔH₁, the Jacobian-vector product of the logits) and takes the second exactly. H_soft − H_θ is the
forecast ``probe/token/deltaH_softmax``.

Why (measured, ``treetune_specs/2026-11-28-forecast-calibration.md``): on collapsing SmolLM2 runs, at states whose
distribution has become peaked, the entropy is far from linear in the logits (H of a peaked softmax moves with the
exponential of its logit gaps), and ΔH₁'s error there was the curvature of H in Δθ, not sampling noise: the central
difference equals ΔH₁ to 1e-4 nats while the even part of the change was 0.1-0.4 nats per token after a collapse.
What H_soft still leaves out is the network's own curvature along the step (ℓ's second-order term).

Built from the three forwards the forecast already takes (θ′, θ, θ − Δθ), in that order, holding one ``[T, V]``
fp64 tensor on the CPU between them (T·V·8 bytes: 100 MB for the CPU study's E of 256 tokens of SmolLM2's 49,152
vocabulary) besides the forward's own ``[T, V]`` float32 log-probabilities.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Tokens per chunk of the final softmax: bounds the temporaries of the last pass to a few [chunk, V] tensors.
_CHUNK = 256


class SoftmaxTangent:
    """``ℓ_θ + ℓ̇`` accumulated over the forecast's three forwards; :meth:`changes` gives H_soft − H_θ per token.

    Usage, in the forwards' order::

        tangent = SoftmaxTangent(plus_log_probs)    # at θ′ = θ + Δθ (the tensor is reused in place)
        tangent.add_theta(theta_log_probs)          # at θ
        change = tangent.changes(minus_log_probs)   # at θ − Δθ: [T] fp64

    H_θ is taken here from the same float32 log-probabilities the same way as H_soft (float64 softmax), so that a zero
    step gives exactly zero and the two share their rounding.
    """

    def __init__(self, plus: torch.Tensor) -> None:
        # float64: a sum of float32 values is exact there, so a zero step gives ℓ_θ back bit for bit
        self._sum = plus.double().mul_(0.5)  # ℓ₊ / 2
        self._h_theta: torch.Tensor | None = None  # [T] fp64

    def add_theta(self, theta: torch.Tensor) -> None:
        """Add ℓ_θ: ``[T, V]`` at the same tokens."""
        _check_shape(theta, self._sum, "θ")
        self._sum.add_(theta.double())
        self._h_theta = _entropies(len(theta), lambda rows: theta[rows].double())

    @torch.no_grad()
    def changes(self, minus: torch.Tensor) -> torch.Tensor:
        """H(softmax(ℓ_θ + (ℓ₊ − ℓ₋) / 2)) − H(softmax(ℓ_θ)) per token, ``[T]`` fp64 (nats), from ℓ₋ at θ − Δθ; frees the
        accumulated tensor."""
        if self._h_theta is None:
            raise RuntimeError("SoftmaxTangent.changes before add_theta")
        _check_shape(minus, self._sum, "θ − Δθ")
        acc = self._sum
        moved = _entropies(len(acc), lambda rows: acc[rows] - 0.5 * minus[rows].double())
        self._sum = torch.empty(0)
        return moved - self._h_theta


def _check_shape(values: torch.Tensor, expected: torch.Tensor, where: str) -> None:
    if values.shape != expected.shape:
        raise ValueError(
            f"softmax tangent: log-probabilities at {where} {tuple(values.shape)}, at θ′ {tuple(expected.shape)}"
        )


@torch.no_grad()
def _entropies(count: int, logits_of: Callable[[slice], torch.Tensor]) -> torch.Tensor:
    """``[count]`` fp64 entropies of softmax(``logits_of(rows)``), ``_CHUNK`` tokens at a time."""
    out = torch.empty(count, dtype=torch.float64)
    for start in range(0, count, _CHUNK):
        rows = slice(start, min(start + _CHUNK, count))
        log_p = torch.log_softmax(logits_of(rows), dim=-1)
        out[rows] = -(log_p.exp() * log_p).sum(-1)
    return out


def per_position(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[T]`` per-token values back to E's ``[B, G, R]`` layout (0 at padding), ``mask`` the response mask."""
    out = torch.zeros(mask.shape, dtype=values.dtype)
    out[mask.bool()] = values
    return out
