# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sampled support of one sampler step: which tokens each row's token was drawn from, and what follows from it.

sglang samples from the tempered distribution truncated by the request's top-k, top-p and min-p. Its torch sampler
(``top_k_top_p_min_p_sampling_from_probs_torch``, both sglang versions; captured in ``support_sampling.py``) sorts
each row's probabilities, zeroes the positions its filters drop and draws from what is left: the *weights* it
samples from. Where no request of the batch filters, sglang draws from the probabilities themselves. Either way the
support is the set of positive weights, and this module only reads it off (issue 48):

- ``sizes``: how many tokens the row's token was drawn from;
- ``token_ids``: those tokens, by descending probability, or ``None`` where nothing was filtered (the row was drawn
  from the whole tempered distribution: storing its ~V ids would say nothing the vocabulary does not);
- ``kept_mass``: the tempered probability of the support (1 to float rounding where nothing was filtered);
- ``entropy``: of the distribution renormalised over the support (nats), the entropy of what was sampled;
- ``sampled_logprob``: the sampled token's log-probability renormalised over the support.

Shapes: ``n`` rows of the step, ``V`` the vocabulary. float32 results, like the step's probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepSupport:
    """One step's supports (module docstring), row ``i`` of each field for row ``i`` of the batch."""

    sizes: torch.Tensor  # [n] int64
    token_ids: tuple[torch.Tensor | None, ...]  # n entries: [sizes[i]] int64 by descending probability, or None
    kept_mass: torch.Tensor  # [n] float32
    entropy: torch.Tensor  # [n] float32, nats
    sampled_logprob: torch.Tensor  # [n] float32


@torch.no_grad()
def read_support(weights: torch.Tensor, sampled: torch.Tensor, order: torch.Tensor | None = None) -> StepSupport:
    """The supports of one step from the weights sglang drew each row's token from.

    Args:
        weights: ``[n, V]`` the tempered probabilities sglang sampled from, 0 where its filters dropped a token:
            in sorted positions (``order`` given: sglang's ``probs_sort`` after its filters) or in vocabulary order
            (``order`` None: the unfiltered probabilities).
        sampled: ``[n]`` the token ids sglang sampled.
        order: ``[n, V]`` the token id at each sorted position (sglang's ``probs_idx``), or None.

    Raises:
        ValueError: mismatched shapes, a row without positive weight, or a sampled token outside its row's support
            (the capture and the sampler disagree: never a silent number).
    """
    if weights.dim() != 2 or sampled.shape != weights.shape[:1] or (order is not None and order.shape != weights.shape):
        raise ValueError(
            f"weights [n, V], sampled [n] and order [n, V] or None: got {tuple(weights.shape)}, "
            f"{tuple(sampled.shape)}, {None if order is None else tuple(order.shape)}"
        )
    weights = weights.float()
    kept = weights > 0
    sizes = kept.sum(dim=-1)
    if bool((sizes == 0).any()):
        raise ValueError(f"rows {torch.nonzero(sizes == 0).flatten().tolist()} have no positive weight")
    mass = weights.sum(dim=-1)
    q = weights / mass[:, None]  # renormalised over the support
    logq = torch.log(q).clamp_(min=torch.finfo(torch.float32).min)  # 0 · log 0 counted as 0
    entropy = -(q * logq).sum(dim=-1)
    sampled = sampled.long()
    if order is None:
        position = sampled
        token_ids: tuple[torch.Tensor | None, ...] = (None,) * weights.shape[0]
    else:
        order = order.long()
        hit = order == sampled[:, None]
        position = hit.float().argmax(dim=-1)
        missing = ~hit.any(dim=-1)
        if bool(missing.any()):
            raise ValueError(f"rows {torch.nonzero(missing).flatten().tolist()}: the sampled token is not in order")
        token_ids = tuple(order[i][kept[i]] for i in range(weights.shape[0]))
    rows = torch.arange(weights.shape[0])
    outside = ~kept[rows, position]
    if bool(outside.any()):
        raise ValueError(
            f"rows {torch.nonzero(outside).flatten().tolist()}: the sampled token is outside the support it was "
            "drawn from (the capture does not match the sampler)"
        )
    return StepSupport(sizes, token_ids, mass, entropy, logq[rows, position])
