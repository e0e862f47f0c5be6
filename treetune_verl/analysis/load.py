# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Responses to analyse, from a generation output directory or a JSONL of ``make run`` records.

A record holds ``prompt``, ``token_texts``, ``logprobs``, ``entropies`` (nats, index-aligned), ``finish_reason``
(text) and ``score`` (``None`` when the response was not scored; ``make run``'s records never are).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from treetune_verl.generation.shards import SHARD_DIR, read_responses

_FIELDS = ("prompt", "token_texts", "logprobs", "entropies", "finish_reason", "score")


def _from_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        missing = [k for k in ("token_texts", "logprobs", "entropies") if k not in record]
        if missing:
            raise ValueError(f"{path} line {line_number}: missing {missing} (expected make run's records)")
        finish = record.get("finish_reason")
        record["finish_reason"] = finish.get("type", "?") if isinstance(finish, dict) else str(finish)
        record.setdefault("score", None)
        record.setdefault("prompt", "")
        records.append({k: record[k] for k in _FIELDS})
    return records


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of a generation output directory (its complete shards, ordered by prompt and sample) or a JSONL."""
    path = Path(path)
    if path.is_dir():
        if not (path / SHARD_DIR).is_dir():
            raise ValueError(f"{path}: not a generation output directory (no {SHARD_DIR}/)")
        table = read_responses(path, columns=("prompt_id", "sample_index") + _FIELDS)
        records = sorted(table.to_pylist(), key=lambda r: (r["prompt_id"], r["sample_index"]))
    elif path.is_file():
        records = _from_jsonl(path)
    else:
        raise ValueError(f"{path}: no such file or directory")
    if not records:
        raise ValueError(f"{path}: no responses to analyse")
    return records
