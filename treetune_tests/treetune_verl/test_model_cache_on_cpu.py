# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``model_cache.publish``: several processes building the same cached model folder at once (two runs started together
on a fresh cache: ``bench_e2e_overhead.py --concurrent`` hit it, both converting SmolLM2 into one ``.partial`` folder)
leave one complete folder, and an incomplete folder of an interrupted build is replaced."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from treetune_verl.model_cache import publish

MARKER = ".complete"
WRITERS = 4


def _write_slowly(folder: Path) -> None:
    """A build: files written over some time, the marker last; every file names the process that wrote it."""
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).write_text(str(os.getpid()))
        time.sleep(0.05)
    (folder / MARKER).write_text(str(os.getpid()))


def _publish_after(barrier, target: Path, results) -> None:
    barrier.wait()
    results.put(str(publish(target, _write_slowly, MARKER)))


def test_concurrent_builds_leave_one_complete_folder(tmp_path):
    target = tmp_path / "models" / "model"
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(WRITERS), context.Queue()
    processes = [context.Process(target=_publish_after, args=(barrier, target, results)) for _ in range(WRITERS)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0] * WRITERS
    assert sorted(results.get(timeout=5) for _ in range(WRITERS)) == [str(target)] * WRITERS
    # one writer's files, whole: no file of another build mixed in
    writers = {path.name: path.read_text() for path in target.iterdir()}
    assert sorted(writers) == sorted([MARKER, "config.json", "model.safetensors", "tokenizer.json"])
    assert len(set(writers.values())) == 1, writers
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # no staging folder left


def test_a_folder_without_its_marker_is_replaced(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("half written")  # an interrupted build: no marker
    assert publish(target, _write_slowly, MARKER) == target
    assert (target / MARKER).read_text() == (target / "config.json").read_text() == str(os.getpid())
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_complete_folder_is_kept(tmp_path):
    target = tmp_path / "model"
    publish(target, _write_slowly, MARKER)
    first = (target / MARKER).stat().st_mtime_ns
    publish(target, _write_slowly, MARKER)  # a second build finds it published and drops its own
    assert (target / MARKER).stat().st_mtime_ns == first
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
