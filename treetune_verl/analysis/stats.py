# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Statistics of per-token entropy (nats) over a set of responses.

Definitions (the tests recompute them by hand):
- quantiles: numpy's default (linear interpolation between order statistics) over all tokens of all responses;
  ``p80`` is the 0.8 quantile, the threshold of the top 20 % ("forking") tokens.
- ``share_below_0.01``: fraction of tokens with entropy < 0.01 nats (near-deterministic).
- forking tokens: tokens with entropy strictly above ``p80``; ``top_forking_tokens`` groups them by token text,
  most frequent first (ties by text), with count and mean entropy.
- relative position of token ``i`` of a response of ``L`` tokens: ``(i + 0.5) / L`` in (0, 1), in ``position_bins``
  equal bins; per bin: tokens, mean, p25, p75.
- correctness: a scored response is correct when ``score >= 0.5`` (the rule-based check gives 1.0 / 0.0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 0.99)
NEAR_DETERMINISTIC_NATS = 0.01


def _summary(values: np.ndarray) -> dict[str, Any]:
    if values.size == 0:
        return {"tokens": 0}
    return {
        "tokens": int(values.size),
        "mean": float(values.mean()),
        "p50": float(np.quantile(values, 0.5)),
        "p80": float(np.quantile(values, 0.8)),
        "share_below_0.01": float((values < NEAR_DETERMINISTIC_NATS).mean()),
    }


def relative_positions(length: int) -> np.ndarray:
    """``(i + 0.5) / length`` for ``i < length``: shape ``[length]``."""
    return (np.arange(length) + 0.5) / length


def correctness(score: float | None) -> str:
    if score is None:
        return "unscored"
    return "correct" if score >= 0.5 else "incorrect"


def compute_stats(records: Sequence[dict[str, Any]], position_bins: int = 10, top: int = 20) -> dict[str, Any]:
    """The stats JSON of a set of records (see module docstring)."""
    entropies = np.concatenate([np.asarray(r["entropies"], dtype=np.float64) for r in records] + [np.zeros(0)])
    if entropies.size == 0:
        raise ValueError("no tokens to analyse (every response is empty)")
    p80 = float(np.quantile(entropies, 0.8))

    position_sum: list[list[float]] = [[] for _ in range(position_bins)]
    forking: dict[str, list[float]] = defaultdict(list)
    by_group: dict[str, list[np.ndarray]] = defaultdict(list)
    responses_by_group: dict[str, int] = defaultdict(int)
    for record in records:
        values = np.asarray(record["entropies"], dtype=np.float64)
        group = correctness(record.get("score"))
        responses_by_group[group] += 1
        by_group[group].append(values)
        bins = np.minimum((relative_positions(values.size) * position_bins).astype(int), position_bins - 1)
        for b, value, text in zip(bins, values, record["token_texts"], strict=True):
            position_sum[b].append(value)
            if value > p80:
                forking[text].append(value)

    per_position = []
    for b, values in enumerate(position_sum):
        arr = np.asarray(values)
        row = {"bin": b, "start": b / position_bins, "end": (b + 1) / position_bins, "tokens": int(arr.size)}
        if arr.size:
            row.update(mean=float(arr.mean()), p25=float(np.quantile(arr, 0.25)), p75=float(np.quantile(arr, 0.75)))
        per_position.append(row)
    ranked = sorted(forking.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:top]
    return {
        "responses": len(records),
        "tokens": int(entropies.size),
        "mean": float(entropies.mean()),
        "std": float(entropies.std()),
        "max": float(entropies.max()),
        "quantiles": {f"p{round(q * 100)}": float(np.quantile(entropies, q)) for q in QUANTILES},
        "p80": p80,
        "share_below_0.01": float((entropies < NEAR_DETERMINISTIC_NATS).mean()),
        "forking_tokens": int(sum(len(v) for v in forking.values())),
        "top_forking_tokens": [{"token": t, "count": len(v), "mean_entropy": float(np.mean(v))} for t, v in ranked],
        "per_position": per_position,
        "per_correctness": {
            group: {"responses": responses_by_group[group], **_summary(np.concatenate(arrays))}
            for group, arrays in sorted(by_group.items())
        },
    }
