# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling's pieces: the completion target, the config refusals, the counter (in process and as the real Ray
actor shared by two workers' ``OverSampleStep``), the metrics and the trainer's reward hook.

The whole path on a real Engine: ``test_over_sample_standalone_on_cpu.py``.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto

from treetune_verl.agent_loop.over_sample import CompletionCounter, OverSampleStep, StepCounter, completion_target
from treetune_verl.rollout.session import new_session_id
from treetune_verl.trainer.features import check_over_sample_config, over_sample_rate
from treetune_verl.trainer.metrics import over_sample_metrics
from treetune_verl.trainer.trainer_seams import _wrap_extract_reward


@pytest.mark.parametrize(
    "rate, batch, target",
    [(0.25, 16, 12), (0.1, 10, 9), (0.0, 7, 7), (0.375, 8, 5), (0.25, 8, 6), (0.99, 3, 1), (0.5, 3, 2)],
)
def test_completion_target_is_ceil_of_the_kept_share(rate, batch, target):
    assert completion_target(rate, batch) == target
    assert target == max(1, math.ceil(round((1 - rate) * batch, 9)))


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
        "actor_rollout_ref": {"model": {"external_lib": "treetune_verl.trainer.actor_setup"}, "rollout": {}},
        "trainer": {"use_legacy_worker_impl": "auto"},
    }
    config = OmegaConf.merge(OmegaConf.create(config), OmegaConf.create(overrides))
    return config


def test_check_over_sample_config_refuses_settings_that_train_aborted_rows_wrongly():
    check_over_sample_config(_config())
    check_over_sample_config(
        _config(actor_rollout_ref={"model": {"external_lib": ["mine", "treetune_verl.trainer.actor_setup"]}})
    )
    for alias in ("treetune_verl.ppo.actor_setup", "treetune_verl.forecast.actor_setup"):  # deprecated names
        check_over_sample_config(_config(actor_rollout_ref={"model": {"external_lib": alias}}))
    for estimator, fix in [("grpo", "grpo_valid"), ("rloo", "rloo_valid"), ("grpo_vectorized", "grpo_valid")]:
        with pytest.raises(ValueError, match=f"adv_estimator={fix}"):
            check_over_sample_config(_config(algorithm={"adv_estimator": estimator}))
    with pytest.raises(ValueError, match="external_lib=treetune_verl.trainer.actor_setup"):
        check_over_sample_config(_config(actor_rollout_ref={"model": {"external_lib": None}}))
    with pytest.raises(ValueError, match="use_legacy_worker_impl"):
        check_over_sample_config(_config(trainer={"use_legacy_worker_impl": "disable"}))
    with pytest.raises(ValueError, match="routing_replay"):
        check_over_sample_config(_config(actor_rollout_ref={"rollout": {"enable_rollout_routing_replay": True}}))


async def test_step_counter_hands_out_exactly_target_slots():
    counter = StepCounter()
    await counter.begin("s", 2)
    waiter = asyncio.create_task(counter.wait("s"))
    assert await counter.claim("s") is True
    await asyncio.sleep(0)
    assert not waiter.done()
    assert await counter.claim("s") is True
    await asyncio.wait_for(waiter, 1)
    assert await counter.claim("s") is False and await counter.claim("s") is False
    assert await counter.open_steps() == 1 and await counter.end("s") == 2 and await counter.open_steps() == 0


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


async def test_two_workers_share_one_batch_wide_target_on_the_real_actor(local_ray):
    """20 trajectories over two workers, target 13: exactly 13 kept whatever the interleaving; once the target is
    reached, each worker aborts exactly its trajectories still open; a late finisher is dropped."""
    counter = CompletionCounter.remote()
    await counter.begin.remote("step", 13)
    servers = [_RecordingServers(), _RecordingServers()]
    steps = [OverSampleStep(counter, "step"), OverSampleStep(counter, "step")]
    watchers = [asyncio.create_task(s.abort_when_target_reached(srv)) for s, srv in zip(steps, servers, strict=True)]
    sessions = [[new_session_id() for _ in range(10)] for _ in steps]
    for step, own in zip(steps, sessions, strict=True):
        for session in own:
            step.open(session)
    # 8 + 6 trajectories finish concurrently (14 claims for 13 slots); the other 6 are still running
    finishing = [(steps[0], s) for s in sessions[0][:8]] + [(steps[1], s) for s in sessions[1][:6]]
    kept = await asyncio.gather(*[step.settle(session) for step, session in finishing])
    await asyncio.wait_for(asyncio.gather(*watchers), 10)
    assert sum(kept) == 13
    assert all(step.target_reached for step in steps)
    assert sorted(servers[0].aborted) == sorted(sessions[0][8:]) and sorted(servers[1].aborted) == sorted(
        sessions[1][6:]
    )
    assert steps[0].aborted_sessions == sorted(sessions[0][8:])
    # an aborted trajectory that stops afterwards is dropped without a claim
    assert await steps[1].settle(sessions[1][7]) is False
    assert await counter.end.remote("step") == 13


def test_over_sample_metrics_by_hand():
    aborted = torch.tensor([False, True, False, True])
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0])
    metrics = over_sample_metrics(aborted, scores)
    assert metrics == pytest.approx(
        {
            "rollout/aborted_ratio": 0.5,
            "rollout/aborted_rows": 2.0,
            "rollout/score/completed_mean": 0.75,  # (1 + 0.5) / 2
            "rollout/score/aborted_as_zero_mean": 0.375,  # (1 + 0.5) / 4
        }
    )
    assert "rollout/score/completed_mean" not in over_sample_metrics(torch.ones(2, dtype=torch.bool), torch.zeros(2))


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
