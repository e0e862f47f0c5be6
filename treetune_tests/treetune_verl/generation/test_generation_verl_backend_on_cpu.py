# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The generation job with ``backend=verl``: verl's agent-loop manager on real Ray with our entropy server.

``run_generation_job`` starts a local Ray cluster of its own (one declared, not real, GPU: what verl's standalone
rollout pool counts; see ``agent_loop/test_entropy_manager_standalone_on_cpu.py``), the installed verl's standalone
rollout (``treetune_verl/verl/<version>/generation_rollout.py``: on verl 0.7.1 ``EntropyAgentLoopManager`` with two
``EntropyAgentLoopWorker`` actors; on verl 0.9.1 verl's ``LLMServerManager`` with our replica and its
``AgentLoopManager`` with two entropy workers; ``EntropySGLangHttpServer`` on a real sglang CPU Engine either way),
sends the rows in two ``generate_sequences`` batches, writes the shards and shuts Ray down. Nothing of the rollout
path is a stand-in. Both stacks.

Checked against an independent teacher-forced HF forward (``torch.log_softmax`` in float64, written in
``standalone.teacher_forced``) on the chat-templated prompt the job computed itself: every token's entropy within
1e-4 nats (a row shifted by one position would fail), every log-probability within 1e-3 (the tokens line up); every
(prompt, sample) written once; a rerun on the Engine backend is accepted and generates nothing; no process of the run
is left after it returns.
"""

from __future__ import annotations

import os

import pytest
import ray
import torch

from treetune_tests.treetune_verl.agent_loop.standalone import (
    descendants,
    driver_state_restored,  # noqa: F401  (fixture, used below)
    end_leftovers,
    teacher_forced,
)
from treetune_verl.generation.config import resolve_config
from treetune_verl.generation.job import load_items, load_tokenizer, prompt_ids, run_generation_job
from treetune_verl.generation.shards import read_responses, shard_paths

pytest.importorskip("uvicorn", reason="sglang's http_server (imported by verl's server) needs uvicorn")
pytest.importorskip("multipart", reason="sglang's http_server needs python-multipart")
pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.usefixtures("driver_state_restored")]

MAX_NEW_TOKENS = 16
ENTROPY_ATOL = 1e-4  # nats
LOGPROB_ATOL = 1e-3


def _error(got: list[float], expected: torch.Tensor) -> float:
    return (torch.tensor(got, dtype=torch.float64) - expected).abs().max().item()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_verl_backend_rows_match_hf(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    config = {
        "backend": "verl",
        "model": {"path": str(tiny_model_dir), "device": "cpu"},
        "input": {"limit": 3},
        "sampling": {"n": 2, "max_new_tokens": MAX_NEW_TOKENS},
        "verl": {"batch_size": 4},  # 6 rows: two generate_sequences calls
        "output": {"dir": str(tmp_path / "out"), "rows_per_shard": 2, "progress": False},
    }
    run_processes: set[int] = set()
    shutdown = ray.shutdown

    def observed_shutdown(*args, **kwargs):  # the job's own Ray processes, seen just before it shuts them down
        run_processes.update(descendants(os.getpid()))
        return shutdown(*args, **kwargs)

    monkeypatch.setattr(ray, "shutdown", observed_shutdown)
    before = descendants(os.getpid())
    result = run_generation_job(config)
    assert not ray.is_initialized()
    assert len(run_processes - before) >= 4, "Ray's processes, the server actor and sglang's scheduler"
    left = end_leftovers(run_processes - before)
    assert not left, f"processes of the run left after it returned: {left}"

    table = read_responses(tmp_path / "out")
    assert result.responses_new == result.responses_total == table.num_rows == 6
    assert len(shard_paths(tmp_path / "out")) >= 3  # written as batches completed (2 rows a shard, or every flush_s)
    rows = {(r["prompt_id"], r["sample_index"]): r for r in table.to_pylist()}
    assert sorted(rows) == [(f"wp-{i:05d}", s) for i in range(3) for s in range(2)]
    assert result.output_tokens_new == sum(len(r["token_ids"]) for r in rows.values())

    cfg = resolve_config(config)
    items = load_items(cfg)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    ids = prompt_ids(tokenizer, items, None, MAX_NEW_TOKENS)
    prompts = {item.prompt_id: item_ids for item, item_ids in zip(items, ids, strict=True)}
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()
    for (prompt_id, sample), row in sorted(rows.items()):
        response = row["token_ids"]
        n = len(response)
        assert 0 < n <= MAX_NEW_TOKENS and len(row["entropies"]) == len(row["logprobs"]) == len(row["token_texts"]) == n
        assert row["finish_reason"] == ("length" if n == MAX_NEW_TOKENS else "stop")
        entropy, token_logp = teacher_forced(hf, prompts[prompt_id], response)
        error = _error(row["entropies"], entropy)
        assert error <= ENTROPY_ATOL, f"{prompt_id}/{sample}: entropy differs from HF by {error:.3g} nats"
        if n > 1:  # negative control: the same values one position late would fail
            late = _error([0.0] + row["entropies"][:-1], entropy)
            assert late > 100 * ENTROPY_ATOL, f"{prompt_id}/{sample}: a shifted row would pass ({late:.3g})"
        logprob_error = _error(row["logprobs"], token_logp)
        assert logprob_error <= LOGPROB_ATOL, f"{prompt_id}/{sample}: logprobs differ from HF by {logprob_error:.3g}"
        assert row["response_text"] == tokenizer.decode(response, skip_special_tokens=True)
        print(f"{prompt_id}/{sample}: {n} tokens, |entropy - HF| {error:.1e} nats, |logprob - HF| {logprob_error:.1e}")

    # resume on the other backend (not part of run.json): everything is written, so nothing is generated or started
    again = run_generation_job({**config, "backend": "engine"})
    assert again.responses_new == 0 and again.responses_total == 6 and not ray.is_initialized()
