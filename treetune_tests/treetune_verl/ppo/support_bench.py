# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What the two stacks' support-replay cost benches share: their arguments, the rows' sampled supports, the memory
they take, and the rounds (ABBA order, the check that the mask ran, the summary, the JSON).

A support is what our server hands verl per response token (``treetune_verl/sglang/support.py``,
``TOKEN_SUPPORT_FIELDS``): ``(size, kept_mass, sampled_logprob, token_ids)``. The benches give every response token a
truncated support (as at ``top_p < 1``, where every sampled token is), of ``1 + Geometric`` ids with a chosen mean,
the token among them: the mask's cost grows with the tokens masked, hardly with the ids kept.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
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


def arguments(description: str, default_out: Path) -> argparse.ArgumentParser:
    """Both benches' options: the model, the rounds, the batch's shape, the supports' mean size, threads, ``--out``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=48)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--support-mean", type=float, default=6.0, help="ids per support, on average")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as verl's Ray workers run)")
    parser.add_argument("--out", type=Path, default=default_out)
    return parser


def run_rounds(
    args: argparse.Namespace,
    verl: str,
    step: Callable[[int, bool], tuple[float, float, float]],
    memory: dict[str, float],
) -> dict[str, Any]:
    """``args.rounds`` rounds of both arms on round ``r``'s rows (``step(r, replay)``: wall seconds, process CPU
    seconds, the old log-probs' mean in nats), in :func:`arm_order`; the JSON written to ``args.out`` after every round
    (an interrupted run keeps its rounds). Returns the last result.

    Raises:
        RuntimeError: a round whose replay arm's log-probs do not lie far above the plain arm's (over supports of a few
            ids they must: else the mask did not run and the bench would time nothing).
    """
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        record: dict[str, float] = {}
        for arm in arm_order(r):
            record[f"{arm}_s"], record[f"{arm}_cpu_s"], record[f"{arm}_log_prob"] = step(r, arm == "replay")
        if not record["replay_log_prob"] > record["plain_log_prob"] + 1.0:
            raise RuntimeError(f"round {r}: the replay arm's log-probs are not over the supports: {record}")
        record["overhead"] = record["replay_s"] / record["plain_s"] - 1
        record["overhead_cpu"] = record["replay_cpu_s"] / record["plain_cpu_s"] - 1
        rounds.append(record)
        print(json.dumps({"round": r, **{k: round(v, 4) for k, v in record.items()}}), flush=True)
        result = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": platform.platform(),
            "verl": verl,
            "goal": "overhead <= 0.05",
            "summary": summarise(rounds, ("overhead", "overhead_cpu", "plain_s", "replay_s")),
            "memory": memory,
            "rounds": rounds,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return result
