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

# One token's support as it travels from the scheduler to ``meta_info["output_token_support"]`` (plain tuples: they
# cross sglang's process boundaries by pickle): (size, kept_mass, sampled_logprob, token_ids or None).
TOKEN_SUPPORT_FIELDS = ("size", "kept_mass", "sampled_logprob", "token_ids")
TokenSupport = tuple[int, float, float, "list[int] | None"]


@dataclass(frozen=True)
class StepSupport:
    """One step's supports (module docstring), row ``i`` of each field for row ``i`` of the batch."""

    sizes: torch.Tensor  # [n] int64
    token_ids: tuple[torch.Tensor | None, ...]  # n entries: [sizes[i]] int64 by descending probability, or None
    kept_mass: torch.Tensor  # [n] float32
    entropy: torch.Tensor  # [n] float32, nats
    sampled_logprob: torch.Tensor  # [n] float32

    def rows(self) -> list[tuple[float, TokenSupport]]:
        """Per row ``(entropy, token support)`` on the host (one transfer per field)."""
        ids = [None if t is None else t.tolist() for t in self.token_ids]
        return [
            (entropy, (size, mass, logprob, row_ids))
            for entropy, size, mass, logprob, row_ids in zip(
                self.entropy.tolist(),
                self.sizes.tolist(),
                self.kept_mass.tolist(),
                self.sampled_logprob.tolist(),
                ids,
                strict=True,
            )
        ]


@torch.no_grad()
def read_support(
    weights: torch.Tensor,
    sampled: torch.Tensor,
    order: torch.Tensor | None = None,
    whole: torch.Tensor | None = None,
) -> StepSupport:
    """The supports of one step from the weights sglang drew each row's token from.

    Args:
        weights: ``[n, V]`` the tempered probabilities sglang sampled from, 0 where its filters dropped a token:
            in sorted positions (``order`` given: sglang's ``probs_sort`` after its filters) or in vocabulary order
            (``order`` None: the unfiltered probabilities).
        sampled: ``[n]`` the token ids sglang sampled.
        order: ``[n, V]`` the token id at each sorted position (sglang's ``probs_idx``), or None.
        whole: ``[n]`` bool, rows whose request truncates nothing (top-k, top-p and min-p off): their ids are not
            stored (``None``), as where ``order`` is None. Their size and kept mass are still what sglang kept:
            at top-p = 1 its float32 running sum can drop a tail of mass ``1 - kept_mass`` (~1e-7).

    Sorted weights keep a prefix of each row (top-k cuts by rank, top-p by the running mass, min-p by value, all
    monotone in the sorted order; checked), so everything after the sizes is computed on the longest prefix only:
    a few columns when every row truncates, instead of the vocabulary.

    Raises:
        ValueError: mismatched shapes, a row without positive weight, sorted weights that are not a prefix, or a
            sampled token outside its row's support (the capture and the sampler disagree: never a silent number).
    """
    n = weights.shape[0] if weights.dim() == 2 else -1
    if (
        weights.dim() != 2
        or sampled.shape != (n,)
        or (order is not None and order.shape != weights.shape)
        or (whole is not None and whole.shape != (n,))
    ):
        raise ValueError(
            f"weights [n, V], sampled [n], order [n, V] or None and whole [n] or None: got {tuple(weights.shape)}, "
            f"{tuple(sampled.shape)}, {None if order is None else tuple(order.shape)}, "
            f"{None if whole is None else tuple(whole.shape)}"
        )
    kept = weights > 0
    sizes = kept.sum(dim=-1)
    if bool((sizes == 0).any()):
        raise ValueError(f"rows {torch.nonzero(sizes == 0).flatten().tolist()} have no positive weight")
    sampled = sampled.long()
    rows = torch.arange(n)
    if order is None:
        position = sampled
    else:
        width = int(sizes.max())
        kept = kept[:, :width]
        if not torch.equal(kept, torch.arange(width)[None, :] < sizes[:, None]):
            raise ValueError("sorted weights whose positive entries are not a prefix: not sglang's filters")
        weights, order = weights[:, :width], order[:, :width].long()
        hit = order == sampled[:, None]
        missing = ~hit.any(dim=-1)
        if bool(missing.any()):
            raise ValueError(
                f"rows {torch.nonzero(missing).flatten().tolist()}: the sampled token is outside the support it was "
                "drawn from (the capture does not match the sampler)"
            )
        position = hit.float().argmax(dim=-1)
    if not bool(kept[rows, position].all()):
        outside = ~kept[rows, position]
        raise ValueError(
            f"rows {torch.nonzero(outside).flatten().tolist()}: the sampled token is outside the support it was "
            "drawn from (the capture does not match the sampler)"
        )
    weights = weights.float()
    mass = weights.sum(dim=-1)
    q = weights / mass[:, None]  # renormalised over the support
    logq = torch.log(q).clamp_(min=torch.finfo(torch.float32).min)  # 0 · log 0 counted as 0
    entropy = -(q * logq).sum(dim=-1)
    if order is None:
        token_ids: tuple[torch.Tensor | None, ...] = (None,) * n
    else:
        whole_rows = [False] * n if whole is None else whole.tolist()
        token_ids = tuple(None if whole_rows[i] else order[i, : int(sizes[i])] for i in range(n))
    return StepSupport(sizes, token_ids, mass, entropy, logq[rows, position])
