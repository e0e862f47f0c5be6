# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""sglang 0.5.6.post2's torch sampler, line for line, also returning the weights it draws from (issue 48).

The same copy as ``v0_5_12/support_sampling.py`` (why a copy: its docstring) of this version's
``sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch``, which differs in the seeded path only:
it draws with ``multinomial_with_seed`` from the filtered weights themselves, with min-p allowed.
"""

from __future__ import annotations

import torch

UPSTREAM_SOURCE_SHA256 = "cac4dcf56af2efaed9d1e69dae22b2ab3775d111f45ddf2ba4e4d8b4f64b95f9"


def sample_with_support(
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    need_min_p_sampling: bool,
    sampling_seed: torch.Tensor | None,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upstream's function; returns ``(batch_next_token_ids [n] int32, weights [n, V] sorted, order [n, V] int32)``
    (``v0_5_12.support_sampling.sample_with_support``)."""
    from sglang.srt.layers.sampler import multinomial_with_seed

    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[torch.arange(0, probs.shape[-1], device=probs.device).view(1, -1) >= top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0

    if need_min_p_sampling:
        min_p_thresholds = probs_sort[:, 0] * min_ps
        probs_sort[probs_sort < min_p_thresholds.view(-1, 1)] = 0.0
    if sampling_seed is not None:
        sampled_index = multinomial_with_seed(probs_sort, sampling_seed, positions)
    else:
        sampled_index = torch.multinomial(probs_sort, num_samples=1)
    probs_idx = probs_idx.to(torch.int32)
    batch_next_token_ids = torch.gather(probs_idx, dim=1, index=sampled_index).view(-1)
    return batch_next_token_ids, probs_sort, probs_idx
