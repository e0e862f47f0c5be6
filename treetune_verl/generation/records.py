# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Per-response records and their plain outputs: a console table and JSONL (shared by the generation job and
``make run``; the HTML heat-map is :mod:`treetune_verl.generation.heatmap`).

A record is one generated response: ``prompt``, ``token_ids``, ``token_texts``, ``logprobs`` and
``entropies`` (nats; one per generated token, index-aligned), plus ``finish_reason``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from treetune_verl.sglang.tokenizer_patches import META_INFO_ENTROPY_KEY


def record_from_output(prompt: str, output: dict[str, Any], decode_token: Callable[[int], str]) -> dict[str, Any]:
    """Build a record from one sglang Engine output requested with ``return_logprob=True``."""
    meta = output["meta_info"]
    logprobs = meta["output_token_logprobs"]
    token_ids = [token_id for _, token_id, _ in logprobs]
    return {
        "prompt": prompt,
        "text": output.get("text", ""),
        "finish_reason": meta["finish_reason"],
        "token_ids": token_ids,
        "token_texts": [decode_token(t) for t in token_ids],
        "logprobs": [lp for lp, _, _ in logprobs],
        "entropies": list(meta[META_INFO_ENTROPY_KEY]),
    }


def entropy_summary(entropies: Sequence[float]) -> dict[str, float]:
    """``tokens``, ``mean``, ``p90`` (nearest-rank) and ``max`` of one response's entropies (nats)."""
    if not entropies:
        return {"tokens": 0, "mean": math.nan, "p90": math.nan, "max": math.nan}
    ordered = sorted(entropies)
    p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]
    return {"tokens": len(ordered), "mean": sum(ordered) / len(ordered), "p90": p90, "max": ordered[-1]}


def format_table(records: Sequence[dict[str, Any]], prompt_width: int = 40) -> str:
    """A fixed-width table: one row per response with token count and mean / p90 / max entropy (nats)."""
    header = f"{'#':>3}  {'prompt':<{prompt_width}}  {'tokens':>6}  {'mean':>7}  {'p90':>7}  {'max':>7}  finish"
    lines = [header, "-" * len(header)]
    for i, record in enumerate(records):
        s = entropy_summary(record["entropies"])
        prompt = record["prompt"].replace("\n", " ")
        prompt = prompt if len(prompt) <= prompt_width else prompt[: prompt_width - 1] + "…"
        finish = record["finish_reason"]["type"] if isinstance(record["finish_reason"], dict) else "?"
        lines.append(
            f"{i:>3}  {prompt:<{prompt_width}}  {s['tokens']:>6}  {s['mean']:>7.3f}  {s['p90']:>7.3f}  "
            f"{s['max']:>7.3f}  {finish}"
        )
    return "\n".join(lines)


def write_jsonl(records: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
