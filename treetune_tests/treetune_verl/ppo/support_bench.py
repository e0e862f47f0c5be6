# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What the two stacks' support-replay cost benches share: the rows' sampled supports, the memory they take, the
rounds' order and summary.

A support is what our server hands verl per response token (``treetune_verl/sglang/support.py``,
``TOKEN_SUPPORT_FIELDS``): ``(size, kept_mass, sampled_logprob, token_ids)``. The benches give every response token a
truncated support (as at ``top_p < 1``, where every sampled token is), of ``1 + Geometric`` ids with a chosen mean,
the token among them: the mask's cost grows with the tokens masked, hardly with the ids kept.
"""

from __future__ import annotations

import math
import pickle
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95

Support = tuple[int, float, float, list[int]]


def token_supports(responses: Sequence[Sequence[int]], vocab: int, mean_size: float, seed: int) -> list[list[Support]]:
    """Per row, a truncated support for each response token: ``1 + Geometric`` distinct ids (mean ``mean_size``),
    the token at a random place among them."""
    rng = np.random.default_rng(seed)
    rows = []
    for response in responses:
        row = []
        for token in response:
            size = int(min(rng.geometric(1.0 / mean_size), vocab))
            others = [int(i) for i in rng.choice(vocab, size=size + 1, replace=False) if i != token][: size - 1]
            ids = [*others]
            ids.insert(int(rng.integers(0, size)), int(token))
            row.append((size, 0.8, -1.0, ids))
        rows.append(row)
    return rows


def _heap_bytes(value: Any, seen: set[int]) -> int:
    """Bytes of ``value`` on the Python heap, objects shared with others (small ints, the same float) counted once."""
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, list | tuple):
        size += sum(_heap_bytes(item, seen) for item in value)
    return size


def support_memory(rows: Sequence[Sequence[Support]]) -> dict[str, float]:
    """Per response token: the supports' pickled bytes (what Ray and TransferQueue move between processes), their
    Python heap bytes (what a process holds while the batch lives), and the mask's transient tensor bytes in the
    actor (int64 row and id, the float32 kept logit: 20 B per kept id, 8 B per masked position)."""
    tokens = sum(len(row) for row in rows)
    ids = sum(len(support[3]) for row in rows for support in row)
    pickled = sum(len(pickle.dumps(list(row), protocol=5)) for row in rows)
    heap = sum(_heap_bytes(list(row), set()) for row in rows)
    return {
        "tokens": tokens,
        "ids_per_token": ids / tokens,
        "pickled_bytes_per_token": pickled / tokens,
        "heap_bytes_per_token": heap / tokens,
        "mask_transient_bytes_per_token": (20 * ids + 8 * tokens) / tokens,
    }


def arm_order(round_index: int) -> tuple[str, str]:
    """ABBA across rounds: a drift of the shared machine hits both arms alike."""
    return ("plain", "replay") if round_index % 4 in (0, 3) else ("replay", "plain")


def summarise(rounds: Sequence[dict[str, float]], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Median over rounds with its distribution-free 95 % CI (NaN below 6 rounds), per key."""
    summary = {}
    for key in keys:
        values = [record[key] for record in rounds]
        low, high = median_ci95(values)
        summary[key] = {
            "median": statistics.median(values),
            "ci95": [None if math.isnan(low) else low, None if math.isnan(high) else high],
        }
    return summary
