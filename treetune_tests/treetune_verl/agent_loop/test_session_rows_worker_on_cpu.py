# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Managed sessions that train several rows, with the agent's own reward, in verl 0.7.1's real ``AgentLoopWorker``.

Our ``EntropyAgentLoopWorker`` with the managed loop, in front of the agent-loop tests' stand-in server
(``fakes.FakeEntropyServer``: deterministic text, a known entropy per token, counts its requests). The batch is what
verl's trainer hands the rollout: each prompt repeated ``rollout.n`` times, consecutive, one uid. Checked from the
batch: which session each row came from (the fake's request count), the agent's scores at each row's last response
token of ``rm_scores`` and its reward extras as columns, the rows of a session sharing their prefix, and each
refusal naming what is wrong. The real-Engine run with verl's reward workers: ``managed/test_managed_standalone_on_cpu.py``.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from treetune_tests.treetune_verl.agent_loop.fakes import (
    FakeEntropyServer,
    compose_config,
    last_token_scores,
    make_batch,
    unpadded,
)
from treetune_tests.treetune_verl.agent_loop.standalone import last_turn_start
from treetune_tests.treetune_verl.managed.agents import branch_score
from treetune_verl.batch_keys import MANAGED_ROW_KEY
from treetune_verl.config import CONFIG_DIR
from treetune_verl.verl.v0_7_1.worker import EntropyAgentLoopWorker

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 128
AGENTS = "treetune_tests.treetune_verl.managed.agents"


def _worker(model_dir, workdir, agent: str, n: int, rows_per_session: int, key: str = "agent_fn"):
    config = compose_config(
        model_dir,
        workdir,
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        extra=[
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={CONFIG_DIR / 'managed_agent_loops.yaml'}",
            f"+actor_rollout_ref.rollout.custom.managed.{key}={AGENTS}:{agent}",
            f"+actor_rollout_ref.rollout.custom.managed.rows_per_session={rows_per_session}",
            f"actor_rollout_ref.rollout.n={n}",
        ],
    )
    worker = EntropyAgentLoopWorker(config, servers=[], load_balancer_handle=None)
    worker.server_manager = FakeEntropyServer(str(model_dir), PROMPT_LENGTH, RESPONSE_LENGTH)
    return worker


def _batch(prompts: int, n: int, validate: bool = False, plans: list[str] | None = None):
    """``prompts`` prompts, each repeated ``n`` times with its own uid, as verl's trainer repeats them."""
    batch = make_batch(plans or ["text text"] * prompts, ["entropy_managed_agent"] * prompts)
    batch.non_tensor_batch["uid"] = np.array([f"uid-{i}" for i in range(prompts)], dtype=object)
    batch.meta_info["validate"] = validate
    return batch.repeat(repeat_times=n, interleave=True)


def test_a_prompts_n_rows_are_n_over_k_sessions_of_k_scored_rows(tiny_model_dir, tmp_path):
    worker = _worker(tiny_model_dir, tmp_path, "branching_agent", n=4, rows_per_session=2)
    out = asyncio.run(worker.generate_sequences(_batch(prompts=2, n=4)))

    assert len(out) == 8
    # 2 prompts x 2 sessions x (1 first turn + 2 branches) requests: the second row of each session ran none
    assert worker.server_manager.calls == 12
    assert out.non_tensor_batch["uid"].tolist() == ["uid-0"] * 4 + ["uid-1"] * 4  # one GRPO group per prompt
    expected = [branch_score(prompt, branch) for prompt in range(2) for _session in range(2) for branch in range(2)]
    assert last_token_scores(out) == pytest.approx(expected)
    assert out.non_tensor_batch["branch"].tolist() == [0.0, 1.0] * 4  # the agent's reward extra, a column
    assert out.meta_info["reward_extra_keys"] == ["branch"]
    for first in range(0, 8, 2):  # a session's two rows: one prompt, one first turn and follow-up
        prompt_a, response_a, mask_a, _ = unpadded(out, first)
        prompt_b, response_b, mask_b, _ = unpadded(out, first + 1)
        assert prompt_a == prompt_b
        branch_starts = [last_turn_start(mask) for mask in (mask_a, mask_b)]
        assert branch_starts[0] == branch_starts[1] > 0  # model / masked follow-up / the branch's model turn
        assert response_a[: branch_starts[0]] == response_b[: branch_starts[0]]
    stats = out.non_tensor_batch[MANAGED_ROW_KEY].tolist()
    assert [row["rows"] for row in stats] == [2] * 8 and [row["branches"] for row in stats] == [2] * 8
    assert [row["turns"] for row in stats] == [2] * 8 and [row["agent_score"] for row in stats] == expected


def test_validation_keeps_one_session_per_row_and_its_first_row(tiny_model_dir, tmp_path):
    worker = _worker(tiny_model_dir, tmp_path, "branching_agent", n=4, rows_per_session=2)
    out = asyncio.run(worker.generate_sequences(_batch(prompts=2, n=1, validate=True)))
    assert len(out) == 2 and worker.server_manager.calls == 6
    assert last_token_scores(out) == [branch_score(0, 0), branch_score(1, 0)]


def test_a_session_returning_another_row_count_is_refused_naming_the_row(tiny_model_dir, tmp_path):
    worker = _worker(tiny_model_dir, tmp_path, "branching_agent", n=1, rows_per_session=1)
    with pytest.raises(ValueError, match=r"uid 'uid-0'.*returned 2 rows.*rows_per_session=1"):
        asyncio.run(worker.generate_sequences(_batch(prompts=1, n=1)))


def test_a_chunk_that_splits_a_session_is_refused_before_any_request(tiny_model_dir, tmp_path):
    worker = _worker(tiny_model_dir, tmp_path, "branching_agent", n=4, rows_per_session=2)
    batch = _batch(prompts=2, n=4)[:7]  # what an uneven split across agent-loop workers would hand one of them
    with pytest.raises(ValueError, match=r"uid 'uid-1' has 3 rows .*\.rows_per_session=2"):
        asyncio.run(worker.generate_sequences(batch))
    assert worker.server_manager.calls == 0


def test_a_non_finite_score_is_refused_naming_the_row(tiny_model_dir, tmp_path):
    worker = _worker(tiny_model_dir, tmp_path, "nan_scoring_agent", n=1, rows_per_session=1)
    with pytest.raises(ValueError, match=r"uid 'uid-0', index 0, row 0: score must be a finite number, got nan"):
        asyncio.run(worker.generate_sequences(_batch(prompts=1, n=1)))


def test_an_environment_trains_the_conversation_its_episode_ended_with(tiny_model_dir, tmp_path):
    """``agents.AddingEnvironment`` by ``custom.managed.environment``: a tool call answered then a reply; a reply
    alone; two tool calls, the episode ending on a tool result at its ``max_turns`` (its row ends at the second call:
    the model never read that result)."""
    worker = _worker(tiny_model_dir, tmp_path, "AddingEnvironment", n=1, rows_per_session=1, key="environment")
    plans = ["tool text", "text", "tool tool"]
    out = asyncio.run(worker.generate_sequences(_batch(prompts=3, n=1, plans=plans)))
    assert last_token_scores(out) == [1.0, 1.0, 0.0]
    assert out.non_tensor_batch["tool_results"].tolist() == [1.0, 0.0, 2.0]
    stats = out.non_tensor_batch[MANAGED_ROW_KEY].tolist()
    assert [(row["turns"], row["tool_calls"]) for row in stats] == [(2, 1), (1, 0), (2, 2)]
    last_mask = unpadded(out, 2)[2]
    assert last_mask[int(out.batch["attention_mask"][2, PROMPT_LENGTH:].sum()) - 1] == 1  # ends on a model token
