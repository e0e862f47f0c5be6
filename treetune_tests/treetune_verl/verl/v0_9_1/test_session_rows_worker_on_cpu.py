# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1's session-rows worker: what it hands verl's own ``AgentLoopWorkerTQ`` methods, and what it refuses.

The real path (a real Engine, TransferQueue, verl's reward worker and GRPO) is
``verl/v0_9_1/test_v1_rollout_standalone_on_cpu.py::test_v1_managed_sessions_of_two_scored_branches_are_rows_of_their_group``.
Here verl's two methods are replaced by recorders (they need a running TransferQueue), to pin the dispatch and the
refusals that run would only show as a failed prompt: each row its own session number, validation's first row, a
session of the wrong size, a prompt count that is not a multiple of k, and every other loop's output untouched.
"""

from __future__ import annotations

import importlib.metadata

import pytest
from omegaconf import OmegaConf

from treetune_verl.batch_keys import MANAGED_ROW_KEY

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

MANAGED = "managed_rows_test_loop"  # registered below, as a loops YAML entry registers it


def _output(managed: bool = True):
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    extra = {MANAGED_ROW_KEY: {"rows": 2}} if managed else {}
    return AgentLoopOutput(prompt_ids=[1], response_ids=[2], response_mask=[1], metrics={}, extra_fields=extra)


@pytest.fixture
def worker(monkeypatch):
    """A ``SessionRowsWorkerTQ`` with k = 2 and ``rollout.n = 4`` whose verl methods record their calls."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from treetune_verl.verl.v0_9_1 import session_rows_worker
    from treetune_verl.verl.v0_9_1.session_rows_worker import SessionRowsWorkerTQ

    calls: dict[str, list] = {"postprocess": [], "run_prompt": [], "status": []}

    async def postprocess(self, output, validate, **kwargs):
        calls["postprocess"].append((output, validate, kwargs["session_id"]))

    async def run_prompt(self, prompt, sampling_params, trajectory, trace=False):
        calls["run_prompt"].append(prompt.get("__rollout_n__"))

    async def kv_put(key, partition_id, tag):
        calls["status"].append((key, tag["status"]))

    parent = AgentLoopWorkerTQ.__ray_actor_class__
    monkeypatch.setattr(parent, "_agent_loop_postprocess", postprocess)
    monkeypatch.setattr(parent, "_run_prompt", run_prompt)
    monkeypatch.setattr(session_rows_worker.tq, "async_kv_put", kv_put)
    monkeypatch.setitem(
        _agent_loop_registry, MANAGED, {"_target_": "treetune_verl.managed.agent_loop.ManagedAgentLoop"}
    )
    instance = SessionRowsWorkerTQ.__new__(SessionRowsWorkerTQ)  # verl's __init__ starts TransferQueue
    instance.rollout_config = OmegaConf.create({"n": 4})
    instance._rows_per_session = 2
    return instance, calls


async def test_each_row_of_a_managed_session_is_put_as_a_session_of_its_own(worker):
    instance, calls = worker
    rows = [_output(), _output()]
    await instance._agent_loop_postprocess(rows, False, uid="u", session_id=1)
    assert [(output, session) for output, _, session in calls["postprocess"]] == [(rows[0], 2), (rows[1], 3)]


async def test_validation_keeps_a_sessions_first_row_and_other_loops_pass_unchanged(worker):
    instance, calls = worker
    rows, segments = [_output(), _output()], [_output(managed=False), _output(managed=False)]
    await instance._agent_loop_postprocess(rows, True, uid="u", session_id=3)
    await instance._agent_loop_postprocess(segments, False, uid="v", session_id=0)  # verl's own segments
    assert calls["postprocess"] == [(rows[0], True, 3), (segments, False, 0)]


async def test_a_session_of_another_size_is_refused_naming_the_uid_and_key(worker):
    instance, calls = worker
    with pytest.raises(ValueError, match=r"uid 'u': the managed agent returned 1 rows; .*rows_per_session=2"):
        await instance._agent_loop_postprocess(_output(), False, uid="u", session_id=0)
    instance._rows_per_session = 1
    with pytest.raises(ValueError, match=r"returned 2 rows; .*rows_per_session=1"):
        await instance._agent_loop_postprocess([_output(), _output()], False, uid="u", session_id=0)
    assert calls["postprocess"] == []


async def test_a_managed_prompt_runs_n_over_k_sessions_and_a_count_not_a_multiple_fails_it(worker):
    instance, calls = worker
    train, validate = {"validate": False}, {"validate": True}
    await instance._run_prompt({"uid": "a", "agent_name": MANAGED}, {}, train)
    await instance._run_prompt({"uid": "b", "agent_name": MANAGED, "__rollout_n__": 6}, {}, train)
    await instance._run_prompt({"uid": "c", "agent_name": MANAGED}, {}, validate)
    await instance._run_prompt({"uid": "d", "agent_name": "single_turn_agent"}, {}, train)
    assert calls["run_prompt"] == [2, 3, None, None]
    await instance._run_prompt({"uid": "e", "agent_name": MANAGED, "__rollout_n__": 3}, {}, train)
    assert calls["run_prompt"] == [2, 3, None, None] and calls["status"] == [("e", "failure")]
