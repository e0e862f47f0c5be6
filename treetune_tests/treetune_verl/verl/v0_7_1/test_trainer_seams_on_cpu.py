# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The trainer seams on verl 0.7.1's real ``RayPPOTrainer``: rollout-vs-actor entropy agreement, validation metrics.

Real: verl's ``RayPPOTrainer._val_metrics_update`` (the wrapped upstream method runs), ``DataProto``, the guards
against verl's installed signatures. The trainer's ``_compute_old_log_prob`` needs actor workers, so its wrapper is
driven with a stand-in for the upstream call that returns what it returns (``old_log_probs``, ``entropys``); the
whole path runs in the e2e (``treetune_tests/e2e``). References are hand-computed.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.protocol import DataProto
from verl.trainer.ppo import ray_trainer

from treetune_verl import timing
from treetune_verl.batch_keys import PENDING_METRICS_KEY
from treetune_verl.patching import is_patched, original_of
from treetune_verl.ppo.entropy_advantage import EntropySteering, entropy_steering, steer_advantages
from treetune_verl.trainer.features import RunFeatures
from treetune_verl.trainer.metrics import actor_agreement_metrics
from treetune_verl.verl import EntropyAgentLoopManager
from treetune_verl.verl.v0_7_1 import trainer_seams as hooks
from treetune_verl.verl_guard import UnsupportedVerlError

ROLLOUT = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
ACTOR = torch.tensor([[1.1, 1.7, 9.0], [0.5, 9.0, 9.0], [3.0, 3.0, 3.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
HAS = torch.tensor([True, True, False])


def test_agreement_metrics_over_masked_rows_with_entropy():
    metrics = actor_agreement_metrics(ROLLOUT, ACTOR, MASK, HAS)
    assert metrics["rollout_entropy/actor_abs_diff/mean"] == pytest.approx((0.1 + 0.3 + 0.0) / 3)
    assert metrics["rollout_entropy/actor_abs_diff/max"] == pytest.approx(0.3)
    assert actor_agreement_metrics(ROLLOUT, ACTOR, torch.zeros_like(MASK)) == {}


def _trainer(entropy_mode: str = "raw", temperature: float = 1.0):
    rollout = {"temperature": temperature, "custom": {"entropy": {"top_k": 0, "mode": entropy_mode}}}
    trainer = object.__new__(ray_trainer.RayPPOTrainer)
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}})
    return trainer


def _batch() -> DataProto:
    return DataProto.from_dict(tensors={"rollout_entropy": ROLLOUT, "response_mask": MASK, "has_rollout_entropy": HAS})


def test_old_log_prob_hook_leaves_the_agreement_for_the_steps_metrics():
    old = DataProto.from_dict(tensors={"old_log_probs": torch.zeros(3, 3), "entropys": ACTOR})
    wrapped = hooks._wrap_compute_old_log_prob(lambda self, batch: (old, 0.25))
    batch = _batch()
    assert wrapped(_trainer(), batch) == (old, 0.25)
    pending = batch.meta_info[PENDING_METRICS_KEY]
    assert pending == actor_agreement_metrics(ROLLOUT, ACTOR, MASK, HAS)
    # compute_data_metrics (wrapped) hands them over once, with verl's own metrics
    data_metrics = hooks._wrap_compute_data_metrics(lambda batch, use_critic=True: {"critic/score/mean": 1.0})
    assert data_metrics(batch=batch, use_critic=False) == {"critic/score/mean": 1.0, **pending}
    assert PENDING_METRICS_KEY not in batch.meta_info

    not_comparable = _batch()
    wrapped(_trainer("raw", temperature=0.7), not_comparable)
    assert PENDING_METRICS_KEY not in not_comparable.meta_info


def test_val_metrics_update_adds_the_validation_rollouts_entropy():
    """verl's real ``_val_metrics_update`` runs; the manager's validation metrics are added under ``val-aux/``."""
    manager = object.__new__(EntropyAgentLoopManager)
    manager._validation_rollouts = [_batch(), _batch()]
    trainer = _trainer()
    trainer.async_rollout_manager = manager
    wrapped = hooks._wrap_val_metrics_update(original_of(ray_trainer.RayPPOTrainer._val_metrics_update))
    metrics = wrapped(trainer, np.array(["arith"] * 2), ["u0", "u1"], {"reward": [1.0, 0.0]}, [])
    assert metrics["val-core/arith/reward/mean@1"] == 0.5  # verl's own
    assert metrics["val-aux/rollout_entropy/mean"] == pytest.approx(3.5 / 3)  # rows 0 and 1, twice
    assert metrics["val-aux/rollout_entropy/max"] == 2.0
    assert metrics["val-aux/rollout_entropy/rows_without_entropy"] == 2.0
    assert manager._validation_rollouts == []  # taken: the next validation starts afresh
    assert (
        wrapped(trainer, np.array(["arith"]), ["u0"], {"reward": [1.0]}, []).get("val-aux/rollout_entropy/mean") is None
    )


def test_install_is_idempotent_and_guarded(monkeypatch):
    for owner, name in [
        (ray_trainer.RayPPOTrainer, "_compute_old_log_prob"),
        (ray_trainer, "compute_data_metrics"),
        (ray_trainer.RayPPOTrainer, "_val_metrics_update"),
        (ray_trainer, "extract_reward"),
        (ray_trainer, "compute_advantage"),
        (ray_trainer, "compute_timing_metrics"),
        (ray_trainer.RayPPOTrainer, "_get_gen_batch"),
        (ray_trainer.RayPPOTrainer, "_validate"),
        (ray_trainer.RayPPOTrainer, "_save_checkpoint"),
        (ray_trainer.RayPPOTrainer, "_load_checkpoint"),
    ]:
        monkeypatch.setattr(owner, name, original_of(getattr(owner, name)))  # upstream for this test, restored after
    monkeypatch.setattr(hooks, "_FEATURES", hooks._FEATURES)  # restored after
    hooks.install(RunFeatures())
    first = ray_trainer.RayPPOTrainer._compute_old_log_prob
    steering = RunFeatures(steering=EntropySteering(pg_token_quantile=0.5))
    hooks.install(steering)
    assert ray_trainer.RayPPOTrainer._compute_old_log_prob is first and is_patched(ray_trainer, "compute_data_metrics")
    assert hooks._FEATURES is steering  # the latest run's features

    upstream = original_of(ray_trainer.extract_reward)
    monkeypatch.setattr(ray_trainer, "compute_advantage", original_of(ray_trainer.compute_advantage))
    monkeypatch.setattr(ray_trainer, "compute_data_metrics", lambda batch: {})  # an upstream signature change
    with pytest.raises(UnsupportedVerlError, match="compute_data_metrics.*verl==0.7.1"):
        hooks.install(RunFeatures())
    # checked before anything is replaced: the seam before it in the list was not wrapped either
    assert not is_patched(ray_trainer, "compute_advantage") and original_of(ray_trainer.extract_reward) is upstream
    monkeypatch.setattr("verl.__version__", "0.8.0")
    with pytest.raises(UnsupportedVerlError, match="found 0.8.0"):
        hooks.install(RunFeatures())


def test_validation_rollouts_are_kept_by_generate_sequences():
    """Only batches with ``meta_info["validate"]`` are kept, with the three keys the metrics need."""
    manager = object.__new__(EntropyAgentLoopManager)
    manager._validation_rollouts = []
    manager._completion_counter = None  # no over-sampling, no failed rows aborted
    manager.rollout_eval = None  # no forecast
    out = _batch()
    out.batch["responses"] = torch.zeros(3, 3, dtype=torch.long)

    async def parent(self, prompts):
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AgentLoopManager, "generate_sequences", parent)  # the parent's fan-out to the workers
        # verl's auto_await: called outside an event loop, it runs the coroutine (as RayPPOTrainer.fit calls it)
        assert manager.generate_sequences(SimpleNamespace(meta_info={"validate": False})) is out
        assert manager._validation_rollouts == []
        manager.generate_sequences(SimpleNamespace(meta_info={"validate": True}))
    (kept,) = manager._validation_rollouts
    assert set(kept.batch.keys()) == {"rollout_entropy", "response_mask", "has_rollout_entropy"}


def _grpo_batch(has_entropy: list[bool] | None = None) -> DataProto:
    """Two GRPO groups of two rows, 3 response tokens each (one padded), with rollout entropy."""
    tensors = {
        "token_level_rewards": torch.tensor([[0, 0, 1.0], [0, 0, 0], [0, 1.0, 0], [0, 0, 0]]),
        "response_mask": torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0]]),
        "rollout_entropy": torch.tensor([[0.1, 2.0, 0.3], [1.5, 0.2, 0.4], [0.5, 3.0, 0.0], [0.6, 0.7, 0.0]]),
    }
    if has_entropy is not None:
        tensors["has_rollout_entropy"] = torch.tensor(has_entropy)
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)})


def test_compute_advantage_seam_masks_verls_advantages_from_rollout_entropy(monkeypatch):
    """The steering settings come from the run's features (the trainer's config), not from the batch."""
    compute_advantage = hooks._wrap_compute_advantage(original_of(ray_trainer.compute_advantage))
    stock = original_of(ray_trainer.compute_advantage)(_grpo_batch(), "grpo").batch["advantages"]
    monkeypatch.setattr(hooks, "_FEATURES", RunFeatures(steering=EntropySteering(pg_token_quantile=0.2)))
    out = compute_advantage(_grpo_batch([True] * 4), "grpo")
    # 10 response tokens -> the 2 highest rollout entropies (3.0 and 2.0) keep their advantage, the rest 0
    kept = torch.zeros(4, 3, dtype=torch.bool)
    kept[0, 1] = kept[2, 1] = True
    assert torch.equal(out.batch["advantages"], torch.where(kept, stock, torch.zeros_like(stock)))
    metrics = out.meta_info[PENDING_METRICS_KEY]
    assert metrics["pg_token_mask/threshold"] == 2.0 and metrics["pg_token_mask/kept_share"] == 0.2
    assert metrics["pg_token_mask/entropy_kept_mean"] == pytest.approx(2.5)
    # steering off: verl's advantages untouched
    monkeypatch.setattr(hooks, "_FEATURES", RunFeatures())
    assert torch.equal(compute_advantage(_grpo_batch(), "grpo").batch["advantages"], stock)


def test_steering_refuses_rows_without_entropy_and_a_batch_without_it():
    steering = EntropySteering(pg_token_quantile=0.5)
    batch = original_of(ray_trainer.compute_advantage)(_grpo_batch([True, False, True, True]), "grpo")
    with pytest.raises(ValueError, match=r"rows \[1\] carry no rollout entropy"):
        steer_advantages(batch, steering)
    batch.batch.pop("rollout_entropy")
    with pytest.raises(ValueError, match="needs batch\\['rollout_entropy'\\]"):
        steer_advantages(batch, steering)


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({}, EntropySteering()),
        ({"pg_token_quantile": 0.2}, EntropySteering(pg_token_quantile=0.2)),
        ({"advantage_shaping": {"alpha": 0.4, "kappa": 2}}, EntropySteering(shaping_alpha=0.4, shaping_kappa=2.0)),
        ({"pg_token_quantile": 1.5}, "pg_token_quantile must be in"),
        ({"advantage_shaping": {"alpha": 0.4, "kappa": 1}}, "kappa > 1"),
    ],
)
def test_entropy_steering_settings(section, expected):
    rollout = OmegaConf.create({"custom": {"entropy": section}})
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=f"actor_rollout_ref.rollout.custom.entropy.*{expected}"):
            entropy_steering(rollout)
    else:
        assert entropy_steering(rollout) == expected
        assert entropy_steering(rollout).active == (expected != EntropySteering())


def test_timing_seam_logs_every_features_seconds_and_their_share_of_the_step(monkeypatch):
    """verl's real ``compute_timing_metrics`` runs; our seconds since the last step join its metrics, then reset."""
    monkeypatch.setattr(timing, "SECONDS", timing.FeatureSeconds())
    monkeypatch.setattr(hooks, "SECONDS", timing.SECONDS)
    wrapped = hooks._wrap_compute_timing_metrics(original_of(ray_trainer.compute_timing_metrics))
    batch = _grpo_batch()
    batch.batch["attention_mask"] = torch.ones(4, 6, dtype=torch.long)
    batch.batch["responses"] = torch.zeros(4, 3, dtype=torch.long)
    timing.SECONDS.waited("steering", 0.25)
    timing.SECONDS.waited("over_sampling", 0.5)
    timing.SECONDS.waited("steering", 0.25)
    timing.SECONDS.add_cpu({"over_sampling": 0.125})  # a worker's
    metrics = wrapped(batch, {"step": 10.0, "gen": 4.0})
    assert metrics["timing_s/gen"] == 4.0  # verl's own
    assert metrics["timing_s/treetune/steering"] == 0.5 and metrics["timing_s/treetune/over_sampling"] == 0.5
    assert metrics["timing_s/treetune/rollout_entropy"] == 0.0 and metrics["timing_s/treetune/trainer_hooks"] == 0.0
    assert metrics["timing_s/treetune/total"] == 1.0 and metrics["treetune/share_of_step"] == pytest.approx(0.1)
    assert metrics["cpu_s/treetune/over_sampling"] == 0.125 and metrics["cpu_s/treetune/total"] == 0.125
    assert wrapped(batch, {"step": 10.0})["timing_s/treetune/total"] == 0.0  # taken: the next step starts at zero


def test_the_seams_time_their_steps_under_their_feature(monkeypatch):
    monkeypatch.setattr(hooks, "SECONDS", timing.FeatureSeconds())
    monkeypatch.setattr(hooks, "_FEATURES", RunFeatures(steering=EntropySteering(pg_token_quantile=0.5)))
    hooks._wrap_compute_advantage(original_of(ray_trainer.compute_advantage))(_grpo_batch([True] * 4), "grpo")
    extract = hooks._wrap_extract_reward(lambda batch: (torch.ones(4, 3), {}))
    extract(_grpo_batch())
    cost = hooks.SECONDS.take()
    for seconds in (cost.critical(), cost.cpu):
        assert set(seconds) == {"steering", "over_sampling"} and all(value > 0 for value in seconds.values())
