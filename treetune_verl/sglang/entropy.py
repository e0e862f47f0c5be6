# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The entropy formula: per-row entropy of a next-token distribution, from logits, in nats.

Where the entropy's path starts: the patched Sampler (``sampler.py``) calls :func:`entropy_for_sampling` on the raw
logits of every batch that wants logprobs. To change what "entropy" means (another truncation, another temperature
rule), change this module; everything downstream only moves the numbers.
"""

from __future__ import annotations

import torch

from treetune_verl.sglang.config import EntropyConfig, validate_top_k


@torch.no_grad()
def compute_entropy(logits: torch.Tensor, top_k: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) along the last dimension, in nats, accumulated in float32.

    Shape notation: ``N`` = rows (batch), ``V`` = vocabulary.

    Args:
        logits: ``[N, V]`` (or any ``[..., V]``) in any float dtype. ``-inf`` entries are masked tokens: the
            result is the entropy over the remaining support. A row that is entirely ``-inf`` or contains NaN
            has no distribution and gives NaN for that row (never a silent number).
        top_k: ``None`` or ``0`` = full vocabulary. ``k > 0`` = entropy of the distribution renormalised over
            the ``k`` largest logits (``k >= V`` is the full vocabulary). Always ``<= log(k)``.

    Returns:
        ``[N]`` (or ``[...]``) float32 entropies in nats.

    Raises:
        ValueError: for a negative or non-integer ``top_k``.
    """
    top_k = validate_top_k(top_k)
    logits = logits.float()
    if top_k is not None and top_k < logits.shape[-1]:
        logits = torch.topk(logits, top_k, dim=-1, sorted=False).values
    # Two [N, V] temporaries and in-place ops: this runs on the sampler's hot path at every decode step.
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    # Masked tokens have p = 0 and logp = -inf, whose product is NaN; clamping logp to the most negative finite
    # float makes their term 0 (as sglang does for its logprobs). NaN survives the clamp, so a row that is all
    # -inf (log_softmax gives NaN throughout) or that contains NaN stays NaN.
    logp.clamp_(min=torch.finfo(logp.dtype).min)
    return -p.mul_(logp).sum(dim=-1)


def entropy_for_sampling(
    logits: torch.Tensor, temperatures: torch.Tensor | None, config: EntropyConfig
) -> torch.Tensor:
    """``[bs]`` float32 entropies (nats) of one sampler step, on the logits' device.

    Args:
        logits: ``[bs, V]`` raw next-token logits (after logit bias / grammar mask, before temperature).
        temperatures: ``[bs, 1]`` per-request temperatures (sglang sets 1.0 for greedy requests); read only in
            ``tempered`` mode.
        config: raw = softmax(logits); tempered = softmax(logits / T); ``top_k`` renormalises over the k largest.
    """
    if config.mode == "support":
        raise ValueError("mode 'support' reads the entropy where sglang samples: support_capture.forward_with_support")
    if config.mode == "tempered":
        logits = logits.float() / temperatures
    return compute_entropy(logits, config.top_k)
