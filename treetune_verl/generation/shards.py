# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Resumable output: completed responses in parquet shards, each written whole or not at all.

Layout of an output directory::

    run.json                        what was asked (model, input, sampling, entropy); a resume must ask the same
    shards/shard-00000.parquet      complete rows only (schema.RESPONSE_SCHEMA)
    shards/shard-00001.parquet ...

A shard is written to ``shard-NNNNN.parquet.tmp``, flushed to disk, then renamed (``os.replace`` is atomic on POSIX),
so a run killed at any moment leaves only whole shards plus, at worst, a ``.tmp`` file that the next run deletes.
Rows buffered in memory when a run is killed are not in any shard and are generated again on resume; on Ctrl-C the
buffer is written first. A resume reads the keys ``(prompt_id, sample_index)`` of every shard and skips them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from treetune_verl.generation.schema import RESPONSE_SCHEMA

SHARD_DIR = "shards"
RUN_FILE = "run.json"
_SHARD_PREFIX, _SHARD_SUFFIX = "shard-", ".parquet"


def shard_paths(out_dir: str | Path) -> list[Path]:
    """The complete shards of an output directory, in write order."""
    return sorted((Path(out_dir) / SHARD_DIR).glob(f"{_SHARD_PREFIX}*{_SHARD_SUFFIX}"))


def read_responses(out_dir: str | Path, columns: Iterable[str] | None = None) -> pa.Table:
    """All complete rows of an output directory as one table (schema.RESPONSE_SCHEMA, or ``columns`` of it)."""
    paths = shard_paths(out_dir)
    columns = list(columns) if columns is not None else None
    if not paths:
        schema = RESPONSE_SCHEMA if columns is None else pa.schema([RESPONSE_SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return pa.concat_tables(pq.read_table(path, columns=columns, schema=RESPONSE_SCHEMA) for path in paths)


def completed_keys(out_dir: str | Path) -> set[tuple[str, int]]:
    """``(prompt_id, sample_index)`` of every response already written."""
    table = read_responses(out_dir, columns=["prompt_id", "sample_index"])
    return set(zip(table["prompt_id"].to_pylist(), table["sample_index"].to_pylist(), strict=True))


def check_run_file(out_dir: str | Path, run: dict[str, Any]) -> None:
    """Write ``run.json``, or, when resuming, refuse a run that asks for something else (naming the keys)."""
    path = Path(out_dir) / RUN_FILE
    run = json.loads(json.dumps(run))  # the form it takes on disk (tuples -> lists)
    if path.exists():
        previous = json.loads(path.read_text())
        changed = sorted(k for k in set(previous) | set(run) if previous.get(k) != run.get(k))
        if changed:
            details = "; ".join(f"{k}: {previous.get(k)!r} -> {run.get(k)!r}" for k in changed)
            raise ValueError(
                f"{out_dir} holds a run with different settings ({details}). Resume with the same settings, "
                "or choose another output directory."
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(path, (json.dumps(run, indent=2) + "\n").encode())


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ShardWriter:
    """Buffers completed rows and writes them as a new shard every ``rows_per_shard`` rows or ``flush_s`` seconds.

    Numbering continues after the shards already present, and leftover ``.tmp`` files (a run killed mid-write) are
    deleted. ``close()`` writes what is buffered; use it in a ``finally`` so Ctrl-C keeps completed rows.
    """

    def __init__(self, out_dir: str | Path, rows_per_shard: int = 64, flush_s: float = 30.0) -> None:
        if rows_per_shard < 1:
            raise ValueError(f"output.rows_per_shard must be >= 1, got {rows_per_shard}")
        self.shard_dir = Path(out_dir) / SHARD_DIR
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.shard_dir.glob("*.tmp"):
            stale.unlink()
        existing = shard_paths(out_dir)
        self.next_index = int(existing[-1].name[len(_SHARD_PREFIX) : -len(_SHARD_SUFFIX)]) + 1 if existing else 0
        self.rows_per_shard, self.flush_s = rows_per_shard, flush_s
        self._rows: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self.rows_written = 0

    def add(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.rows_per_shard or time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> Path | None:
        """Write the buffered rows as one shard (atomically); returns its path, or ``None`` if nothing was buffered."""
        self._last_flush = time.monotonic()
        if not self._rows:
            return None
        path = self.shard_dir / f"{_SHARD_PREFIX}{self.next_index:05d}{_SHARD_SUFFIX}"
        tmp = path.with_name(path.name + ".tmp")
        table = pa.Table.from_pylist(self._rows, schema=RESPONSE_SCHEMA)
        with tmp.open("wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.rows_written += len(self._rows)
        self._rows.clear()
        self.next_index += 1
        return path

    def close(self) -> None:
        self.flush()
