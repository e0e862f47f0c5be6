# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The generation job on a real CPU Engine (tiny random Qwen2): files, entropy as the Engine returned it, resume.

Greedy decoding, one request in flight: every request runs alone in its batch, so two runs choose the same tokens.
Their floats agree to ~1e-7, not bit for bit: sglang's prefix cache makes a repeated prompt's prefill compute fewer
positions (the second sample of a prompt, or the bare Engine's rerun below), which rounds differently.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from treetune_tests.treetune_verl.sglang.engine_helpers import entropy_engine, hf_token_entropy
from treetune_verl.analysis.pipeline import analyse
from treetune_verl.generation.config import resolve_config
from treetune_verl.generation.job import load_items, prompt_ids, run_generation_job
from treetune_verl.generation.schema import COLUMNS
from treetune_verl.generation.shards import read_responses, shard_paths

pytestmark = pytest.mark.engine
FLOAT_ATOL = 1e-5  # nats / log-probability: prefix-cache rounding (module docstring), far below any real error
REPO_ROOT = Path(__file__).resolve().parents[3]


def job_config(model, out_dir) -> dict:
    return {
        "model": {"path": str(model), "device": "cpu"},
        "input": {"limit": 6},
        "sampling": {"n": 2, "temperature": 0.0, "max_new_tokens": 16},
        "engine": {"max_in_flight": 1},
        "output": {"dir": str(out_dir), "rows_per_shard": 1, "progress": False},
    }


def as_overrides(config: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in config.items():
        out += as_overrides(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}={value}"]
    return out


def by_key(table) -> dict:
    return {(r["prompt_id"], r["sample_index"]): r for r in table.to_pylist()}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with entropy_engine(tiny_model_dir) as engine:
        yield engine


@pytest.fixture(scope="module")
def uninterrupted(engine, tiny_model_dir, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("uninterrupted")
    result = run_generation_job(job_config(tiny_model_dir, out_dir), engine=engine)
    return out_dir, result


def test_default_set_writes_every_response_once(uninterrupted):
    out_dir, result = uninterrupted
    table = read_responses(out_dir)
    assert tuple(table.column_names) == COLUMNS
    assert result.responses_new == result.responses_total == table.num_rows == 12 == len(shard_paths(out_dir))
    assert sorted(by_key(table)) == [(f"wp-{i:05d}", s) for i in range(6) for s in range(2)]
    for row in table.to_pylist():
        n = len(row["token_ids"])
        assert 0 < n <= 16 and len(row["token_texts"]) == len(row["logprobs"]) == len(row["entropies"]) == n
        assert (
            row["score"] in (0.0, 1.0) and row["ground_truth"].isdigit() and row["finish_reason"] in ("stop", "length")
        )
    assert result.output_tokens_new == sum(len(r) for r in table["token_ids"].to_pylist())


def test_every_entropy_is_what_the_engine_returned(uninterrupted, engine, tiny_model_dir):
    """The same requests sent to the bare Engine (one at a time, greedy): the rows hold exactly its tokens,
    logprobs and entropies; and a teacher-forced HF recomputation agrees within 1e-4 nats."""
    out_dir, _ = uninterrupted
    rows = by_key(read_responses(out_dir))
    cfg = resolve_config(job_config(tiny_model_dir, out_dir))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    items = load_items(cfg)
    for item, ids in zip(items, prompt_ids(tokenizer, items, None, 16), strict=True):
        meta = engine.generate(
            input_ids=ids, sampling_params={"max_new_tokens": 16, "temperature": 0.0}, return_logprob=True
        )["meta_info"]
        for sample in range(2):
            row = rows[(item.prompt_id, sample)]
            assert row["token_ids"] == [t for _, t, _ in meta["output_token_logprobs"]]
            assert row["logprobs"] == pytest.approx([lp for lp, _, _ in meta["output_token_logprobs"]], abs=FLOAT_ATOL)
            assert row["entropies"] == pytest.approx(meta["output_token_entropy"], abs=FLOAT_ATOL)
            assert row["entropies"] != pytest.approx([0.0] * len(row["entropies"]), abs=FLOAT_ATOL)
        expected = hf_token_entropy(tiny_model_dir, ids, row["token_ids"])
        assert max(abs(a - b) for a, b in zip(row["entropies"], expected, strict=True)) < 1e-4


def test_analysis_of_a_real_generation_output(uninterrupted):
    out_dir, _ = uninterrupted
    stats = analyse(out_dir)
    table = read_responses(out_dir)
    entropies = [e for row in table["entropies"].to_pylist() for e in row]
    assert stats["tokens"] == len(entropies) and stats["responses"] == 12
    assert stats["max"] == max(entropies) and stats["mean"] == pytest.approx(sum(entropies) / len(entropies))
    assert sum(g["responses"] for g in stats["per_correctness"].values()) == 12
    assert {p.name for p in (out_dir / "analysis" / "plots").iterdir()} == {
        "histogram.png",
        "position.png",
        "correctness.png",
        "top_tokens.png",
    }


def _descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def test_killed_and_resumed_equals_uninterrupted(uninterrupted, tiny_model_dir, tmp_path):
    """SIGKILL the job (and the Engine processes it spawned) once a few shards exist; a rerun with the same output
    directory generates exactly the missing responses, and the result equals the uninterrupted run's."""
    out_dir = tmp_path / "resumed"
    command = [sys.executable, "-m", "treetune_verl.generation", *as_overrides(job_config(tiny_model_dir, out_dir))]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    started: set[int] = {process.pid}
    deadline = time.monotonic() + 240
    while len(shard_paths(out_dir)) < 3 and process.poll() is None and time.monotonic() < deadline:
        started |= _descendants(process.pid)
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)  # the group this test started: the job and sglang's processes
    process.wait()
    killed_with = len(read_responses(out_dir))
    assert 3 <= killed_with < 12, f"the kill should land mid-way, after {killed_with} of 12 responses"

    resumed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{killed_with} of 12 responses already written; {12 - killed_with} to generate" in resumed.stdout
    table = read_responses(out_dir)
    assert table.num_rows == 12 and len(by_key(table)) == 12  # no duplicate, none lost
    resumed_rows, reference = by_key(table), by_key(read_responses(uninterrupted[0]))
    assert resumed_rows.keys() == reference.keys()
    for key, row in resumed_rows.items():
        expected = reference[key]
        for column in ("token_ids", "token_texts", "response_text", "finish_reason", "score", "prompt", "ground_truth"):
            assert row[column] == expected[column], (key, column)
        for column in ("logprobs", "entropies"):
            assert row[column] == pytest.approx(expected[column], abs=FLOAT_ATOL), (key, column)
    time.sleep(2)
    left = [pid for pid in started if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert left == []
