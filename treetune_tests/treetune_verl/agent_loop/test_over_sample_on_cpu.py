# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling's pieces: the completion target in whole groups, the config refusals, the counter (in process and as
the real Ray actor shared by two workers' ``OverSampleStep``), the metrics and the trainer's reward hook.

The whole path on a real Engine: ``test_over_sample_standalone_on_cpu.py``.
"""

from __future__ import annotations

import asyncio
import math
import random
import time

import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto

from treetune_tests.treetune_verl.known_times import burn_cpu, close
from treetune_verl.agent_loop.over_sample import (
    CompletionCounter,
    OverSampleStep,
    StepCounter,
    group_sizes,
)
from treetune_verl.rollout.session import group_session_id, new_session_id
from treetune_verl.trainer.features import RunFeatures, check_over_sample_config, completion_target, over_sample_rate
from treetune_verl.trainer.metrics import ABORT_METRICS, batch_abort_metrics, score_metrics
from treetune_verl.verl.v0_7_1.trainer_seams import _wrap_extract_reward


@pytest.mark.parametrize(
    "rate, groups, target",
    [(0.25, 16, 12), (0.1, 10, 9), (0.0, 7, 7), (0.375, 8, 5), (0.25, 8, 6), (0.99, 3, 1), (0.5, 3, 2)],
)
def test_completion_target_is_ceil_of_the_kept_share(rate, groups, target):
    assert completion_target(rate, groups) == target
    assert target == max(1, math.ceil(round((1 - rate) * groups, 9)))


def test_over_sample_rate_reads_verls_key_and_refuses_out_of_range():
    assert over_sample_rate(OmegaConf.create({})) == 0.0
    assert over_sample_rate(OmegaConf.create({"over_sample_rate": None})) == 0.0
    assert over_sample_rate(OmegaConf.create({"over_sample_rate": 0.25})) == 0.25
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="actor_rollout_ref.rollout.over_sample_rate must be in"):
            over_sample_rate(OmegaConf.create({"over_sample_rate": bad}))


def _config(**overrides):
    config = {
        "algorithm": {"adv_estimator": "grpo_valid"},
        "actor_rollout_ref": {"model": {"external_lib": "treetune_verl.verl.process_setup"}, "rollout": {}},
        "trainer": {"use_legacy_worker_impl": "auto"},
    }
    config = OmegaConf.merge(OmegaConf.create(config), OmegaConf.create(overrides))
    return config


def test_check_over_sample_config_refuses_settings_that_train_aborted_rows_wrongly():
    check_over_sample_config(_config())
    check_over_sample_config(
        _config(actor_rollout_ref={"model": {"external_lib": ["mine", "treetune_verl.verl.process_setup"]}})
    )
    for estimator in ("grpo", "rloo", "grpo_vectorized"):  # whole groups: verl's own statistics are right
        check_over_sample_config(_config(algorithm={"adv_estimator": estimator}))
    with pytest.raises(ValueError, match="adv_estimator=gpg: its batch-wide scale .* Use one of: .*grpo,"):
        check_over_sample_config(_config(algorithm={"adv_estimator": "gpg"}))  # the full table: its own test file
    with pytest.raises(ValueError, match="external_lib=treetune_verl.verl.process_setup"):
        check_over_sample_config(_config(actor_rollout_ref={"model": {"external_lib": None}}))
    with pytest.raises(ValueError, match="use_legacy_worker_impl"):
        check_over_sample_config(_config(trainer={"use_legacy_worker_impl": "disable"}))
    with pytest.raises(ValueError, match="routing_replay"):
        check_over_sample_config(_config(actor_rollout_ref={"rollout": {"enable_rollout_routing_replay": True}}))


async def test_step_counter_keeps_the_first_whole_groups_to_complete():
    """Groups of 2, target 2: a finished row waits for its group; the first two groups to complete are kept (each
    with every row), the waiting row of the third is dropped when the target is reached, a row stopping later is
    dropped at once."""
    counter = StepCounter()
    await counter.begin("s", 2, {"a": 2, "b": 2, "c": 2})
    reached = asyncio.create_task(counter.wait("s"))
    a_first = asyncio.create_task(counter.settle("s", "a"))
    b_first = asyncio.create_task(counter.settle("s", "b"))
    await asyncio.sleep(0.01)
    assert not a_first.done() and not b_first.done()  # their groups are still running
    assert await counter.settle("s", "b") is True  # b complete: kept, and its waiting row with it
    assert await asyncio.wait_for(b_first, 1) is True
    assert not a_first.done() and not reached.done()
    c_first = asyncio.create_task(counter.settle("s", "c"))
    assert await counter.settle("s", "c") is True  # c completes second: the target
    assert await asyncio.wait_for(c_first, 1) is True
    await asyncio.wait_for(reached, 1)
    assert await asyncio.wait_for(a_first, 1) is False  # a did not complete in time
    assert await counter.settle("s", "a") is False  # its last row, after the target
    assert await counter.open_steps() == 1 and await counter.end("s") == 2 and await counter.open_steps() == 0


async def test_a_failed_row_drops_its_group_and_wakes_its_waiting_rows():
    """Failed rows aborted without over-sampling (target = every group): a row whose loop raised decides its group
    (dropped): the group's waiting row wakes to ``False``, a later row gets ``False`` at once; the other group is kept
    whole; the target is never reached and nothing waits for it."""
    counter = StepCounter()
    await counter.begin("s", 2, {"a": 2, "b": 2})
    a_first = asyncio.create_task(counter.settle("s", "a"))
    b_first = asyncio.create_task(counter.settle("s", "b"))
    await asyncio.sleep(0.01)
    assert not a_first.done()
    assert await counter.settle("s", "a", failed=True) is False
    assert await asyncio.wait_for(a_first, 1) is False
    assert await counter.settle("s", "b") is True and await asyncio.wait_for(b_first, 1) is True
    assert await counter.end("s") == 1
    await counter.begin("t", 1, {"a": 2})
    assert await counter.settle("t", "a", failed=True) is False
    assert await counter.settle("t", "a") is False  # a row of a failed group, stopping later


def test_abort_failed_rows_reads_its_key_and_needs_what_over_sampling_needs():
    failed_on = {"custom": {"over_sample": {"abort_failed_rows": True}}}
    features = RunFeatures.from_config(OmegaConf.create({"actor_rollout_ref": {"rollout": failed_on}}))
    assert features.abort_failed_rows and features.aborts_rows and features.over_sample_rate == 0
    assert not RunFeatures.from_config(OmegaConf.create({})).aborts_rows
    bad = {"actor_rollout_ref": {"rollout": {"custom": {"over_sample": {"abort_failed_rows": "yes"}}}}}
    with pytest.raises(ValueError, match="custom.over_sample.abort_failed_rows must be true or false"):
        RunFeatures.from_config(OmegaConf.create(bad))
    with pytest.raises(ValueError, match="abort_failed_rows=true with algorithm.adv_estimator=gpg"):
        check_over_sample_config(_config(algorithm={"adv_estimator": "gpg"}, actor_rollout_ref={"rollout": failed_on}))
    with pytest.raises(ValueError, match="abort_failed_rows=true needs the actor"):
        check_over_sample_config(_config(actor_rollout_ref={"model": {"external_lib": None}, "rollout": failed_on}))


async def test_step_counter_refuses_what_is_not_a_group_of_the_batch():
    counter = StepCounter()
    with pytest.raises(ValueError, match="target 3 groups of 2"):
        await counter.begin("s", 3, {"a": 1, "b": 1})
    await counter.begin("s", 1, {"a": 1, "b": 1})
    with pytest.raises(KeyError, match="group 'z' is not in the batch"):
        await counter.settle("s", "z")


def test_group_sizes_count_the_uid_column_and_refuse_a_batch_without_it():
    assert group_sizes(np.array(["u1", "u1", "u2", "u1"], dtype=object)) == {"u1": 3, "u2": 1}
    with pytest.raises(ValueError, match=r'non_tensor_batch\["uid"\]'):
        group_sizes(None)


class _RecordingServers:
    """Stands in for the servers behind a worker's ``SessionServerManager``: records the sessions it is told to
    abort (the real servers' abort is tested in ``rollout/test_server_abort_on_cpu.py``)."""

    def __init__(self) -> None:
        self.aborted: list[str] = []

    async def abort_sessions(self, sessions: list[str]) -> None:
        self.aborted += sessions


@pytest.fixture(scope="module")
def local_ray():
    ray.init(
        address="local", num_cpus=1, include_dashboard=False, _system_config={"prestart_worker_first_driver": False}
    )
    yield
    ray.shutdown()


async def test_two_workers_keep_whole_groups_split_between_them_on_the_real_actor(local_ray):
    """10 groups of 2, each split over two workers (row 0 on one, row 1 on the other), target 8: exactly 8 groups are
    kept, each with both rows, whatever the interleaving; the 9th group to finish is dropped (both rows); once the
    target is reached each worker aborts exactly its trajectories still open."""
    counter = CompletionCounter.remote()
    groups = [f"g{i}" for i in range(10)]
    await counter.begin.remote("step", completion_target(0.25, len(groups)), dict.fromkeys(groups, 2))
    servers = [_RecordingServers(), _RecordingServers()]
    steps = [OverSampleStep(counter, "step"), OverSampleStep(counter, "step")]
    watchers = [asyncio.create_task(s.abort_when_target_reached(srv)) for s, srv in zip(steps, servers, strict=True)]
    sessions = [[new_session_id() for _ in groups] for _ in steps]  # sessions[w][g]: row w of group g
    for step, own in zip(steps, sessions, strict=True):
        for session in own:
            step.open(session)
    # groups 0..8 finish (both rows, concurrently, shuffled); group 9 is still running on both workers
    finishing = [(w, g) for g in range(9) for w in range(2)]
    random.Random(0).shuffle(finishing)
    kept = await asyncio.gather(*[steps[w].settle(sessions[w][g], groups[g]) for w, g in finishing])
    await asyncio.wait_for(asyncio.gather(*watchers), 10)
    fate: dict[int, set[bool]] = {}
    for (_, g), keep in zip(finishing, kept, strict=True):
        fate.setdefault(g, set()).add(keep)
    assert all(len(f) == 1 for f in fate.values())  # both rows of a group share its fate
    assert sum(f == {True} for f in fate.values()) == 8
    assert all(step.target_reached for step in steps)
    for w in range(2):
        assert servers[w].aborted == [sessions[w][9]] and steps[w].aborted_sessions == [sessions[w][9]]
    # an aborted trajectory that stops afterwards is dropped without asking the counter
    assert await steps[1].settle(sessions[1][9], groups[9]) is False
    assert await counter.end.remote("step") == 8


async def test_the_forecasts_e_of_a_dropped_group_is_aborted_with_it_and_a_kept_groups_is_not(local_ray):
    """E of a group runs under the group's session (``eval_session``); at the target the step aborts it only for the
    groups it drops (a kept group's E must finish: the forecast trains on it), and a group whose first turn comes
    after the target gets no E."""
    counter = CompletionCounter.remote()
    await counter.begin.remote("e", 1, {"kept": 1, "dropped": 1})
    servers, step = _RecordingServers(), OverSampleStep(counter, "e")
    watcher = asyncio.create_task(step.abort_when_target_reached(servers))
    rows = {group: new_session_id() for group in ("kept", "dropped")}
    for session in rows.values():
        step.open(session)
    assert {group: step.eval_session(group) for group in rows} == {group: group_session_id(group) for group in rows}
    assert await step.settle(rows["kept"], "kept") is True
    await asyncio.wait_for(watcher, 10)
    assert servers.aborted == [rows["dropped"], group_session_id("dropped")] == step.aborted_sessions
    assert step.eval_session("late") is None
    assert await counter.kept_groups.remote("e") == ["kept"] and await counter.end.remote("e") == 1


async def test_more_waiting_rows_than_rays_default_concurrency_on_the_real_actor(local_ray):
    """1500 groups of 2: the first row of every group waits at the actor before any second row arrives (1500 waiting
    calls, over Ray's default of 1000 for an async actor, which would queue the completing rows behind them)."""
    counter = CompletionCounter.remote()
    groups = [f"g{i}" for i in range(1500)]
    await counter.begin.remote("big", len(groups), dict.fromkeys(groups, 2))
    first = [counter.settle.remote("big", g) for g in groups]
    await asyncio.sleep(1.0)
    second = [counter.settle.remote("big", g) for g in groups]
    kept = await asyncio.wait_for(asyncio.gather(*first, *second), 120)
    assert all(kept) and await counter.end.remote("big") == 1500


async def test_ending_a_step_wakes_its_waiters_when_the_target_was_not_reached(local_ray):
    """A step whose failures left fewer whole groups than the target: ``end`` answers the parked ``wait`` calls
    (``False``), so no call stays parked at the actor after its step."""
    counter = CompletionCounter.remote()
    await counter.begin.remote("short", 2, {"a": 1, "b": 1})
    waiting = counter.wait.remote("short")
    assert await counter.settle.remote("short", "a") is True
    assert await counter.settle.remote("short", "b", True) is False  # b failed: the target of 2 is out of reach
    assert await counter.end.remote("short") == 1
    assert await asyncio.wait_for(waiting, 10) is False
    await counter.begin.remote("full", 1, {"a": 1})
    waiting = counter.wait.remote("full")
    await counter.settle.remote("full", "a")
    assert await asyncio.wait_for(waiting, 10) is True and await counter.end.remote("full") == 1


@pytest.mark.parametrize("eval_tail_s", [0.0, 0.8])
async def test_the_managers_over_sampling_cost_is_the_steps_wait_after_the_target_and_the_workers_cpu(
    local_ray, monkeypatch, eval_tail_s
):
    """Issue 49's stand-in on verl 0.7.1: the manager's real ``generate_sequences`` around stand-in workers whose
    times are known. They generate 0.3 s before the target (verl's time), settle the kept group at the real counter,
    then take ``wait_s`` (1.5 s) more before the step's rows are back (the abort's time, on the step's path) and burn
    ``work_s`` of CPU in a timed block of their own process, shipped with the rows as a real worker's are.

    ``rollout/abort_wait_s`` is the known wait, ``timing_s/treetune/over_sampling`` the step's wall time on our code
    (the test's own clock: the call's wall less the stand-in's time before the target) and ``cpu_s`` the work, each
    within 10 % (20 ms floor). The old definition gave the worker's summed awaits instead.

    ``eval_tail_s`` > 0: the stand-in's rows have settled at the end of the wait (it says when, as the forecast's
    worker does, ``ROWS_SETTLED_AT_KEY``) and it waits that much longer for the forecast's E of a kept group: the abort
    wait ends where the rows settled, and over-sampling's share of the step's wall leaves the E tail out (it is the
    forecast's: the step waits for E of its kept groups with or without over-sampling)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    from treetune_verl import timing
    from treetune_verl.batch_keys import (
        OVER_SAMPLE_META_KEY,
        PENDING_METRICS_KEY,
        ROLLOUT_ABORTED_KEY,
        ROLLOUT_ABORTED_TOKENS_KEY,
        ROLLOUT_FAILED_KEY,
        ROWS_SETTLED_AT_KEY,
        TIMING_KEY,
    )
    from treetune_verl.verl import EntropyAgentLoopManager
    from treetune_verl.verl.v0_7_1 import entropy_manager

    wait_s, work_s = 1.5, 0.25  # long enough that 10 % of it covers a loaded machine's scheduling
    seconds = timing.FeatureSeconds()
    monkeypatch.setattr(entropy_manager, "SECONDS", seconds)
    truth: dict[str, float] = {}

    async def workers(self, prompts):
        truth["workers_start"] = time.perf_counter()
        plan = prompts.meta_info[OVER_SAMPLE_META_KEY]
        await asyncio.sleep(0.3)
        await asyncio.gather(*(plan["counter"].settle.remote(plan["step"], "A") for _ in range(2)))
        truth["reached"] = time.perf_counter()
        await asyncio.sleep(wait_s)
        worker_seconds = timing.FeatureSeconds()  # a worker process's
        with worker_seconds.timed(timing.OVER_SAMPLING):
            burn_cpu(work_s)
        shipped = np.array([worker_seconds.take().cpu, None, None, None], dtype=object)
        truth["end"] = time.perf_counter()
        non_tensors = {TIMING_KEY: shipped}
        if eval_tail_s:
            non_tensors[ROWS_SETTLED_AT_KEY] = np.array([time.time(), None, None, None], dtype=object)
            await asyncio.sleep(eval_tail_s)  # the forecast's E of a kept group still decoding
        columns = {
            ROLLOUT_ABORTED_KEY: torch.tensor([False, False, True, True]),
            ROLLOUT_FAILED_KEY: torch.zeros(4, dtype=torch.bool),
            ROLLOUT_ABORTED_TOKENS_KEY: torch.tensor([0, 0, 4, 9]),
        }
        return DataProto.from_dict(tensors=columns, non_tensors=non_tensors)

    monkeypatch.setattr(AgentLoopManager, "generate_sequences", workers)
    manager = object.__new__(EntropyAgentLoopManager)  # no servers: the stand-in is the workers
    manager._completion_counter = CompletionCounter.remote()
    manager._over_sample_rate, manager._abort_failed_rows = 0.5, False
    manager.carry_over, manager.rollout_eval = None, None
    prompts = DataProto.from_dict(
        tensors={"x": torch.zeros(4, 1)},
        non_tensors={"uid": np.array(["A", "A", "B", "B"], dtype=object)},
        meta_info={"global_steps": 1},
    )
    start = time.perf_counter()
    output = await manager.generate_sequences(prompts)
    wall = time.perf_counter() - start
    metrics = timing.step_metrics(seconds.take(), step_s=None)
    abort_wait = output.meta_info[PENDING_METRICS_KEY]["rollout/abort_wait_s"]
    # the call's wall less verl's generation and the forecast's E tail
    on_our_code = wall - (truth["reached"] - truth["workers_start"]) - eval_tail_s

    assert close(abort_wait, truth["end"] - truth["reached"]) and abort_wait >= wait_s
    assert close(metrics["timing_s/treetune/over_sampling"], on_our_code)
    assert close(metrics["cpu_s/treetune/over_sampling"], work_s)
    assert TIMING_KEY not in output.non_tensor_batch and ROLLOUT_ABORTED_TOKENS_KEY not in set(output.batch.keys())
    assert ROWS_SETTLED_AT_KEY not in output.non_tensor_batch
    pending = output.meta_info[PENDING_METRICS_KEY]
    assert {key: pending[key] for key in ABORT_METRICS if key != "rollout/abort_wait_s"} == {
        "rollout/kept_groups": 1.0,
        "rollout/aborted_groups": 1.0,
        "rollout/failed_groups": 0.0,
        "rollout/aborted_rows": 2.0,
        "rollout/failed_rows": 0.0,
        "rollout/aborted_ratio": 0.5,
        "rollout/aborted_tokens": 13.0,
    }


def test_over_sample_metrics_by_hand():
    """Groups a (kept), b (dropped: one row cut with 5 tokens, one finished too late with 3), c (failed: one row
    raised, its sibling cut with 2 tokens); the scores of the kept rows 1 and 0.5."""
    uids = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    aborted = torch.tensor([False, False, True, True, True, True])
    failed = torch.tensor([False, False, False, False, True, False])
    tokens = torch.tensor([0, 0, 5, 3, 0, 2])
    metrics = batch_abort_metrics(uids, aborted, failed, tokens, abort_wait_s=0.25)
    assert metrics == pytest.approx(
        {
            "rollout/kept_groups": 1.0,
            "rollout/aborted_groups": 2.0,
            "rollout/failed_groups": 1.0,
            "rollout/aborted_rows": 4.0,
            "rollout/failed_rows": 1.0,
            "rollout/aborted_ratio": 4 / 6,
            "rollout/aborted_tokens": 10.0,
            "rollout/abort_wait_s": 0.25,
        }
    )
    assert set(metrics) == set(ABORT_METRICS)
    scores = score_metrics(completed_mean=0.75, kept_rows=2, aborted_rows=4)
    assert scores == pytest.approx(
        {"rollout/score/completed_mean": 0.75, "rollout/score/aborted_as_zero_mean": (1 + 0.5) / 6}
    )
    assert score_metrics(None, kept_rows=0, aborted_rows=4) == {"rollout/score/aborted_as_zero_mean": 0.0}


def test_extract_reward_hook_zeroes_aborted_rows_whoever_scored_them():
    """verl's reward may score an aborted (empty) row, e.g. a format penalty: the hook sets it to 0."""
    rewards = torch.tensor([[0.0, 1.0], [-1.0, 0.0], [0.0, 0.5]])

    def original(batch):
        return batch.batch["rm_scores"].clone(), {"acc": np.array([1, 0, 1])}

    hook = _wrap_extract_reward(original)
    batch = DataProto.from_dict(tensors={"rm_scores": rewards, "rollout_aborted": torch.tensor([False, True, False])})
    reward, extras = hook(batch)
    assert torch.equal(reward, torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.5]]))
    assert list(extras["acc"]) == [1, 0, 1]
    assert torch.equal(batch.batch["rm_scores"], rewards)  # the batch's own tensor is not modified
    unmarked = DataProto.from_dict(tensors={"rm_scores": rewards})
    assert torch.equal(hook(unmarked)[0], rewards)
