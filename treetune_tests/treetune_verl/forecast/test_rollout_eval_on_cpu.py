# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The live forecast's E beside over-sampling (``forecast/rollout_eval.py``): a request cut by an abort leaves its
prompt out (a cut response would bias E toward short answers), E's task carries the session whose abort cuts it and
nothing of the row's context, and only a trained group's missing E is warned about.

The client is a recorder of what ``sample_eval`` sends: the real requests on a real Engine are
``rollout/test_server_abort_on_cpu.py`` (E cut by its group's abort) and every over-sampled forecast e2e run.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from treetune_verl.agent_loop.trajectory import PROMPT_HOOK
from treetune_verl.forecast.rollout_eval import EvalCut, EvalPlan, RolloutEval, SampledEval, sample_eval, start_sampling
from treetune_verl.forecast.settings import forecast_settings
from treetune_verl.rollout.session import EVAL_SESSION, group_session_id

PLAN = EvalPlan(n=3, temperature=1.0, budget=8)


class Client:
    """Answers each request with two tokens and ``stops`` (one stop reason per request, in order); records the E
    session and prompt hook each request saw."""

    def __init__(self, stops: list[str]) -> None:
        self.stops, self.seen = list(stops), []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict) -> SimpleNamespace:
        self.seen.append((EVAL_SESSION.get(), PROMPT_HOOK.get()))
        await asyncio.sleep(0)
        return SimpleNamespace(token_ids=[1, 2], stop_reason=self.stops.pop(0))


async def test_e_with_a_request_cut_by_an_abort_is_refused_whole():
    sampled = await sample_eval(Client(["stop", "length", "stop"]), [5, 6], PLAN)
    assert [r.tolist() for r in sampled.response_ids] == [[1, 2]] * 3
    with pytest.raises(EvalCut, match="1 of E's 3 requests"):
        await sample_eval(Client(["stop", "abort", "stop"]), [5, 6], PLAN)


async def test_es_task_carries_the_session_that_cuts_it_and_nothing_of_the_rows_context():
    client, tasks = Client(["stop"] * 6), {}
    token = PROMPT_HOOK.set(lambda prompt_ids: None)
    try:
        start_sampling(tasks, "u", [5], PLAN, client, abort_with=group_session_id("u"))
        start_sampling(tasks, "v", [5], PLAN, client)
        start_sampling(tasks, "u", [7], PLAN, client)  # once per uid
        await asyncio.gather(*tasks.values())
    finally:
        PROMPT_HOOK.reset(token)
    assert sorted(tasks) == ["u", "v"] and EVAL_SESSION.get() is None
    assert sorted(client.seen, key=str) == sorted([(group_session_id("u"), None)] * 3 + [(None, None)] * 3, key=str)


def test_only_a_trained_groups_missing_e_is_warned_about(caplog):
    settings = forecast_settings({"custom": {"entropy_forecast": {"eval_share": 1.0}}})
    rollout_eval = RolloutEval(settings, OmegaConf.create({"n": 2, "temperature": 1.0, "response_length": 8}))
    rollout_eval.plans(["a", "a", "b", "b", "c", "c"])
    sampled = {"a": SampledEval(np.array([5]), [np.array([1]), np.array([2])], ["k0", "k1"], 0.1)}
    with caplog.at_level(logging.WARNING, logger="treetune_verl.forecast.rollout_eval"):
        E, _ = rollout_eval.responses(sampled, batch_tokens=10, trained={"a", "b"})  # c was dropped, its E cut
    assert E.uids == ["a"]
    assert "no usable E for uids ['b']" in caplog.text
