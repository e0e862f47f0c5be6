# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1's forecast worker: when E starts, where it goes, and what a failure costs.

The real path (a real Engine, TransferQueue, verl's workers and client) is
``verl/v0_9_1/test_v1_rollout_standalone_on_cpu.py::test_v1_rollout_real_engine_matches_hf`` (E's prompts, lengths,
request keys and metrics) and every step of the current stack's GRPO runs (``e2e/test_e2e_variants_on_cpu.py``). Here
verl's own ``_run_prompt`` and ``_run_agent_loop`` run a registered test loop (:class:`SendsOneTurn`) through our
``SessionLLMServerClient``; what would need servers or a running TransferQueue is a recorder: the server call below
the client (``LLMServerClient.generate``), verl's row put (``AgentLoopWorkerTQ._agent_loop_postprocess``), the
uid's status put and E's put. That pins what the real run shows only as a missing forecast or a stuck step: E started
once, at session 0's first turn, with that turn's prompt, its requests named after the group's session (so the
group's abort cuts them: the server side is ``rollout/test_server_abort_on_cpu.py``); E put before session 0's row; E
cut by its group's abort or failing costs the forecast that prompt, not the row; a session that raises leaves no
request of E running; nothing kept per uid afterwards.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

from treetune_verl.batch_keys import FORECAST_EVAL_PLAN_KEY

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

LOOP = "forecast_worker_test_loop"
PROMPT_IDS = [5, 6, 7]  # what the test loop's turns send
N = 2  # rollout.n: sessions per prompt, and E's responses per prompt


class SendsOneTurn:
    """An agent loop of verl's registry that sends one turn through the worker's client and returns; a prompt whose
    ``raw_prompt`` is ``"raise"`` raises in session 0 after its turn."""

    def __init__(self, server_manager: Any, **_: Any) -> None:
        self.client = server_manager

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

        output = await self.client.generate("row", prompt_ids=list(PROMPT_IDS), sampling_params=dict(sampling_params))
        if kwargs["raw_prompt"] == "raise" and kwargs["session_id"] == 0:
            raise RuntimeError("the loop failed")
        return AgentLoopOutput(
            prompt_ids=list(PROMPT_IDS),
            response_ids=list(output.token_ids),
            response_mask=[1] * len(output.token_ids),
            metrics={},
        )


@pytest.fixture
def worker(monkeypatch):
    """A ``ForecastEvalWorkerTQ`` (``rollout.n`` = 2, no managed rows) whose servers and TransferQueue are recorders:
    ``(worker, events, control)``; ``events`` in the order they happened, ``control`` steers E's server calls."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.workers.rollout.llm_server import LLMServerClient

    from treetune_verl.verl.v0_9_1 import forecast_eval_worker, session_rows_worker
    from treetune_verl.verl.v0_9_1.forecast_eval_worker import ForecastEvalWorkerTQ
    from treetune_verl.verl.v0_9_1.over_sample_worker import SessionLLMServerClient

    events: list[tuple] = []
    control = SimpleNamespace(fail_eval=False, hold_eval=asyncio.Event(), cancelled=0, eval_stop="stop", eval_rids=[])
    control.hold_eval.set()

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        if request_id.startswith("forecast-eval-"):
            events.append(("eval request", tuple(prompt_ids), sampling_params["max_new_tokens"]))
            control.eval_rids.append(self._vllm_request_id(request_id))  # what verl's client sends to the server
            try:
                await control.hold_eval.wait()
            except asyncio.CancelledError:
                control.cancelled += 1
                raise
            if control.fail_eval:
                raise RuntimeError("the server failed")
            return SimpleNamespace(token_ids=[8, 9], stop_reason=control.eval_stop)
        events.append(("turn", tuple(prompt_ids)))
        return SimpleNamespace(token_ids=[1, 2, 3])

    async def put_row(self, output, validate, **kwargs):
        assert FORECAST_EVAL_PLAN_KEY not in kwargs, "the plan reached the row's fields"
        events.append(("row", kwargs["uid"], kwargs["session_id"]))

    async def put_status(key, partition_id, tag):
        events.append(("status", key, tag["status"]))

    async def put_sampled(uid, sampled):
        events.append(("E put", uid, tuple(sampled.prompt_ids.tolist()), [r.tolist() for r in sampled.response_ids]))

    monkeypatch.setattr(LLMServerClient, "generate", generate)
    monkeypatch.setattr(AgentLoopWorkerTQ.__ray_actor_class__, "_agent_loop_postprocess", put_row)
    monkeypatch.setattr(session_rows_worker.tq, "async_kv_put", put_status)
    monkeypatch.setattr(forecast_eval_worker, "put_sampled", put_sampled)
    monkeypatch.setitem(_agent_loop_registry, LOOP, {"_target_": f"{__name__}.SendsOneTurn"})

    instance = ForecastEvalWorkerTQ.__new__(ForecastEvalWorkerTQ)  # verl's __init__ starts TransferQueue
    instance.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": N, "val_kwargs": {"n": 1}}}, "data": {}})
    instance.rollout_config = instance.config.actor_rollout_ref.rollout
    instance._rows_per_session = 1
    instance._eval_plans, instance._eval_tasks = {}, {}
    instance.llm_client = SessionLLMServerClient.__new__(SessionLLMServerClient)
    for name in ("tokenizer", "processor", "hf_model_type", "dataset_cls", "tools"):
        setattr(instance, name, None)
    return instance, events, control


def _plan():
    from treetune_verl.forecast.rollout_eval import EvalPlan

    return EvalPlan(n=N, temperature=1.0, budget=16)


async def _run(instance, uid: str, raw_prompt: str = "hi", plan=None) -> None:
    prompt = {"uid": uid, "agent_name": LOOP, "raw_prompt": raw_prompt, FORECAST_EVAL_PLAN_KEY: plan}
    trajectory = {"validate": False, "step": 1, "sample_index": 0, "rollout_n": 0}
    await instance._run_prompt(prompt, {"temperature": 1.0}, trajectory=trajectory)


async def test_e_starts_at_session_0s_first_turn_once_and_is_put_before_its_row(worker):
    instance, events, _ = worker
    await _run(instance, "u", plan=_plan())
    turns = [e for e in events if e[0] == "turn"]
    eval_requests = [e for e in events if e[0] == "eval request"]
    assert len(turns) == N and eval_requests == [("eval request", tuple(PROMPT_IDS), 16)] * N  # session 0's, once
    assert events.index(eval_requests[0]) > events.index(turns[0])  # started by the first turn
    put = events.index(("E put", "u", tuple(PROMPT_IDS), [[8, 9]] * N))
    assert put < events.index(("row", "u", 0))  # the uid is finished only with its E there
    assert events[-1] == ("status", "u", "finished")
    assert instance._eval_plans == {} and instance._eval_tasks == {}


async def test_es_requests_are_named_after_the_groups_session(worker):
    from treetune_verl.rollout.session import group_session_id, is_eval_request, session_of

    instance, _, control = worker
    await _run(instance, "u", plan=_plan())
    assert len(control.eval_rids) == N and len(set(control.eval_rids)) == N
    assert all(session_of(rid) == group_session_id("u") and is_eval_request(rid) for rid in control.eval_rids)


async def test_e_cut_by_its_groups_abort_is_left_out_quietly_and_the_row_goes_on(worker, caplog):
    instance, events, control = worker
    control.eval_stop = "abort"  # what the server answers once the group's session is aborted
    with caplog.at_level(logging.INFO, logger="treetune_verl.verl.v0_9_1.forecast_eval_worker"):
        await _run(instance, "u", plan=_plan())
    assert not any(e[0] == "E put" for e in events)
    assert sorted(e for e in events if e[0] == "row") == [("row", "u", 0), ("row", "u", 1)]
    assert events[-1] == ("status", "u", "finished")
    assert "E of uid u was cut with its dropped group" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_prompt_without_a_plan_samples_no_e(worker):
    instance, events, _ = worker
    await _run(instance, "v")
    assert [e[0] for e in events if e[0] in ("eval request", "E put")] == []
    assert sorted(e for e in events if e[0] == "row") == [("row", "v", 0), ("row", "v", 1)]


async def test_e_failing_costs_the_forecast_that_prompt_not_the_row(worker, caplog):
    instance, events, control = worker
    control.fail_eval = True
    with caplog.at_level(logging.WARNING):
        await _run(instance, "u", plan=_plan())
    assert not any(e[0] == "E put" for e in events)
    assert sorted(e for e in events if e[0] == "row") == [("row", "u", 0), ("row", "u", 1)]
    assert events[-1] == ("status", "u", "finished")
    assert "E of uid u failed" in caplog.text


async def test_a_session_that_raises_leaves_no_request_of_e_running(worker):
    instance, events, control = worker
    control.hold_eval.clear()  # E still decoding when session 0 fails
    await _run(instance, "u", raw_prompt="raise", plan=_plan())
    assert events[-1] == ("status", "u", "failure")
    await asyncio.sleep(0)  # let the cancellation reach E's requests
    assert control.cancelled == N and instance._eval_tasks == {} and instance._eval_plans == {}
    assert not any(e[0] == "E put" for e in events)
