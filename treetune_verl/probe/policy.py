# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sampling policy π(·|s): temperature, then top-p (nucleus) masking with renormalisation.

One function defines the policy for both sampling (``sampling.py``) and teacher forcing (``teacher_forcing.py``), so
the log-probabilities and entropies the probe differentiates belong to exactly the distribution the responses were
drawn from.

Shape notation:
    ... = any leading dims (rows of a batch, positions)
    V   = vocabulary size

Top-p convention (the sglang/vLLM one): sort the tempered probabilities in descending order and keep a token when the
probability mass strictly before it is below ``top_p``. The kept set is the smallest prefix whose mass reaches
``top_p`` (the most probable token is always kept); ties at the boundary are broken by the sort order. ``top_p = 1``
keeps every token and skips the sort. The mask is a piecewise-constant function of θ, so it carries no gradient;
the gradients below are those of the renormalised distribution on a fixed support, which is the derivative
almost everywhere.

All outputs are computed in fp32 whatever the logits' dtype (bf16 log-softmax over 49k tokens loses ~3 digits).
"""

from __future__ import annotations

import torch


def check_policy_args(temperature: float, top_p: float) -> None:
    """Raise ``ValueError`` unless ``temperature > 0`` and ``0 < top_p <= 1``."""
    if not temperature > 0:
        raise ValueError(f"generation.temperature must be > 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"generation.top_p must be in (0, 1], got {top_p}")


@torch.no_grad()
def nucleus_mask(log_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask of the tokens kept by top-p, from tempered (unmasked) log-probabilities.

    Args:
        log_probs: ``[..., V]`` log-softmax of the tempered logits (any float dtype).
        top_p: nucleus mass in (0, 1).

    Returns:
        ``[..., V]`` bool, True for kept tokens.
    """
    probs = log_probs.float().exp()
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., V], mass strictly before each sorted token
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def policy_log_probs(
    logits: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the sampling policy.

    Args:
        logits: ``[..., V]`` raw model logits (differentiable).
        temperature: τ > 0; the policy is softmax(logits / τ) before top-p.
        top_p: nucleus mass in (0, 1]; 1 disables masking.

    Returns:
        ``(log_probs, keep)``: ``log_probs`` is ``[..., V]`` fp32, ``-inf`` outside the nucleus and renormalised inside;
        ``keep`` is the ``[..., V]`` bool nucleus mask, or ``None`` when ``top_p == 1``.
    """
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature  # a [..., V] pass saved at τ = 1
    if top_p >= 1.0:
        return torch.log_softmax(scaled, dim=-1), None
    keep = nucleus_mask(torch.log_softmax(scaled.detach(), dim=-1), top_p)
    return torch.log_softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1), keep


def entropy_from_log_probs(log_probs: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Entropy in nats of each distribution, ``[..., V] -> [...]`` fp32, differentiable.

    Masked entries hold ``-inf``; they are zeroed with ``masked_fill`` before the product, because
    ``0 * -inf`` would make both the value and its gradient NaN.
    """
    finite_log_probs = log_probs if keep is None else log_probs.masked_fill(~keep, 0.0)
    return -torch.linalg.vecdot(log_probs.exp(), finite_log_probs)  # Σ_v p·log p without a [..., V] product
