# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The actor's logits over the support each token was sampled from (issue 48: replay of the sampled support).

sglang samples a truncated request's token from the tempered distribution renormalised over the support its top-k /
top-p / min-p left (``treetune_verl/sglang/support.py``). For the actor's log-probs and entropy to describe that
distribution, every logit outside the token's support is set ``MARGIN`` nats below the tensor's largest logit (so at
least that far below the position's largest kept one) before verl's temperature, log-softmax and entropy: its
probability is then exactly 0 in float32 and bfloat16 at any
temperature >= 0.01 (exp(-1e4 / T) underflows), the kept ones renormalise among themselves, and the result stays
finite (a ``-inf`` fill makes verl's entropy ``sum(p * logits)`` NaN; the dtype's minimum overflows once divided by
a temperature below 1). Gradients reach the kept logits only. No verl import: the version seams find the positions.

Shapes: ``N`` positions of the logits, ``V`` the vocabulary, ``K`` positions to mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MARGIN = 1e4  # nats below the position's largest logit


def mask_outside_support(logits: torch.Tensor, positions: torch.Tensor, supports: Sequence[Sequence[int]]) -> None:
    """In place: at ``logits[positions[k]]`` every token but ``supports[k]`` is set ``MARGIN`` below the tensor's max.

    Args:
        logits: ``[N, V]`` (a view of the model's logits: the caller's tensor is changed).
        positions: ``[K]`` int64 rows of ``logits`` to mask.
        supports: ``K`` lists of token ids, the support at each position (non-empty).

    Raises:
        ValueError: a float16 logits tensor (``MARGIN`` does not fit), mismatched lengths, an empty support or an id
            outside the vocabulary.
    """
    if logits.dtype == torch.float16:
        raise ValueError("support replay needs float32 or bfloat16 logits: float16 cannot hold a 1e4-nat margin")
    if len(supports) != positions.numel():
        raise ValueError(f"{positions.numel()} positions for {len(supports)} supports")
    if not len(supports):
        return
    sizes = torch.tensor([len(ids) for ids in supports])
    if bool((sizes == 0).any()):
        raise ValueError(f"empty supports at positions {positions[sizes == 0].tolist()}")
    ids = torch.tensor([token for ids in supports for token in ids], dtype=torch.int64, device=logits.device)
    vocab = logits.shape[-1]
    if bool(((ids < 0) | (ids >= vocab)).any()):
        raise ValueError(f"support ids outside the vocabulary [0, {vocab})")
    positions = positions.to(logits.device)
    # In place and without a [K, V] copy (a micro-batch of 8k tokens at a 150k vocabulary would copy ~5 GB): gather the
    # kept logits, fill the masked rows, put the kept ones back. The fill sits MARGIN below the largest logit of the
    # whole tensor, so at least MARGIN below each row's own largest kept one. Autograd: the gather saves only its
    # indices, the fill zeroes the rows' gradient, the put routes it back to the kept logits.
    rows = torch.repeat_interleave(positions, sizes.to(logits.device))
    kept = logits[rows, ids]
    fill = float(logits.detach().max()) - MARGIN
    logits.index_fill_(0, positions, fill)
    logits[rows, ids] = kept
