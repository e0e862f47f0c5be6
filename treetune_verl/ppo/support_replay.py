# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The actor's logits over the support each token was sampled from (issue 48: replay of the sampled support).

sglang samples a truncated request's token from the tempered distribution renormalised over the support its top-k /
top-p / min-p left (``treetune_verl/sglang/support.py``). For the actor's log-probs and entropy to describe that
distribution, every logit outside the token's support is set ``MARGIN_NATS * T`` below the position's largest kept
logit before verl divides by the temperature ``T`` and takes its log-softmax and entropy: each masked token then sits
``MARGIN_NATS`` nats below the support's mode, with probability at most exp(-64) ~ 1.6e-28 (a vocabulary of 262k
leaks < 5e-23 of mass, 14 orders below float32's resolution of 1: the kept tokens' log-probs and the entropy are those
of the support alone to the last bit), and everything stays finite (a ``-inf`` fill makes verl's entropy
``sum(p * logits)`` NaN).

Why not further below (a first version filled 1e4 nats under the tensor's max, for exact zeros): CPU's vectorised
``exp`` is ~10x slower on inputs under -87 nats, where float32 underflows (measured: 445 ms against 41 ms for
896 x 49,152 on one thread), and the log-softmax's forward and backward take the ``exp`` of every masked entry; the
actor's step was 14-15 % slower on SmolLM2 for it (``bench_support_replay.py``). 64 nats keeps both: the fast path
and no measurable mass. Gradients reach the masked logits only through their e^-64 share of the softmax. No verl
import: the version seams find the positions.

Shapes: ``N`` positions of the logits, ``V`` the vocabulary, ``K`` positions to mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MARGIN_NATS = 64.0  # below the position's largest kept logit, after the temperature


def mask_outside_support(
    logits: torch.Tensor,
    positions: torch.Tensor,
    supports: Sequence[Sequence[int]],
    temperature: float | torch.Tensor,
) -> None:
    """In place: at ``logits[positions[k]]`` every token but ``supports[k]`` is set ``MARGIN_NATS * T_k`` below the
    largest of ``logits[positions[k], supports[k]]``.

    Args:
        logits: ``[N, V]`` (a view of the model's logits: the caller's tensor is changed), before the temperature.
        positions: ``[K]`` int64 rows of ``logits`` to mask.
        supports: ``K`` lists of token ids, the support at each position (non-empty).
        temperature: the sampling temperature verl divides these logits by: one (a float) or one per position
            (``[K]``).

    Raises:
        ValueError: a float16 logits tensor (verl's actor runs float32 or bfloat16), mismatched lengths, an empty
            support, an id outside the vocabulary or a temperature that is not positive.
    """
    if logits.dtype == torch.float16:
        raise ValueError("support replay needs float32 or bfloat16 logits, not float16")
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
    temperature = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device).expand(len(supports))
    if not bool((temperature > 0).all()):
        raise ValueError(f"support replay needs positive temperatures, got {temperature.unique().tolist()}")
    positions = positions.to(logits.device)
    sizes = sizes.to(logits.device)
    # In place and without a [K, V] copy (a micro-batch of 8k tokens at a 150k vocabulary would copy ~5 GB): gather the
    # kept logits, fill the masked rows (one value per row, broadcast), put the kept ones back. Outside autograd: the
    # fill values are constants, so the masked logits' true gradient is the log-softmax's own through them, <= e^-64
    # of the kept ones'; recorded, the two in-place edits cost autograd a zeroed [N, V] gradient and an accumulating
    # scatter each (the log-softmax's backward 3.1x slower on SmolLM2's shapes in an ad-hoc timing; ~1.3x this way). An autograd
    # node that had saved these logits would fail loudly in backward ("modified by an inplace operation"), never
    # silently: verl's log-softmax and entropy read them after this.
    with torch.no_grad():
        rows = torch.repeat_interleave(positions, sizes)
        kept = logits[rows, ids]
        segment = torch.repeat_interleave(torch.arange(len(supports), device=logits.device), sizes)
        kept_max = torch.full((len(supports),), -torch.inf, device=logits.device)
        kept_max = kept_max.scatter_reduce(0, segment, kept.float(), "amax")
        fill = (kept_max - MARGIN_NATS * temperature).to(logits.dtype)
        logits.index_put_((positions,), fill[:, None])
        logits[rows, ids] = kept
