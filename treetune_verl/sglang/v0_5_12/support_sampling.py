# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""sglang 0.5.12's torch sampler, line for line, also returning the weights it draws from (issue 48).

``sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch`` sorts the probabilities, zeroes what the
row's top-k, top-p and min-p drop and draws from the rest; the weights it draws from are its locals, so no wrapper
can read them, and sorting again would repeat its most expensive step (a second full-vocabulary sort of every row,
each step). This copy runs the same operations in the same order and returns the
sampled ids as upstream does, plus ``probs_sort`` after the filters and ``probs_idx``: the support by construction,
ties and the top-p boundary included. ``UPSTREAM_SOURCE_SHA256`` is the hash of the upstream function's source this
copy was made from; ``support_sampling.upstream_source_problem`` refuses any other. sglang >= 0.5.20 returns the
same from its own function (``return_filtered_probs``).
"""

from __future__ import annotations

import torch

UPSTREAM_SOURCE_SHA256 = "1fd25199a33fd6f7fdda048c2e255e56074c4df5dcc739f02831f4b38ee5da9a"


def sample_with_support(
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    need_min_p_sampling: bool,
    sampling_seed: torch.Tensor | None,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upstream's function (module docstring); returns ``(batch_next_token_ids [n] int32, weights [n, V] sorted,
    order [n, V] int32)``: the weights it drew from (0 where filtered) and the token id at each sorted position."""
    from sglang.srt.layers.sampler import multinomial_with_seed

    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[torch.arange(0, probs.shape[-1], device=probs.device).view(1, -1) >= top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0

    if need_min_p_sampling:
        assert sampling_seed is None, "With sampling seed, multinomial_with_seed will provide wrong results"
        min_p_thresholds = probs_sort[:, 0] * min_ps
        probs_sort[probs_sort < min_p_thresholds.view(-1, 1)] = 0.0

    if sampling_seed is None:
        sampled_index = torch.multinomial(probs_sort, num_samples=1)
    else:
        # upstream: logprobs of the filtered weights in float64 (the weights themselves are kept here for the support)
        logprobs = probs_sort.to(torch.float64)
        logprobs.log_()
        sampled_index = multinomial_with_seed(logprobs, sampling_seed, positions)

    probs_idx = probs_idx.to(torch.int32)
    batch_next_token_ids = torch.gather(probs_idx, dim=1, index=sampled_index).view(-1)
    return batch_next_token_ids, probs_sort, probs_idx
