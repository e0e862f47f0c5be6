# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The trainer-side entry point: called by our agent-loop manager in the trainer's process with verl's whole config.

:func:`install` refuses what cannot run (``features.check_features``: a feature without its prerequisite, or with a
verl setting it does not cover, naming both keys), creates the run's state (carry-over's buffer) and installs the
trainer's seams (``trainer_seams.py``) with the run's features and that state, read from this config: the trainer
acts on its own settings, nothing travels through the rollout. The manager gets the same state from the return
value (:class:`TrainerRun`): the seams never reach into the manager for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from treetune_verl.agent_loop.carry_over import CarryOver
from treetune_verl.rollout.rollout_config import CONFIG_PATH, ENTROPY_SECTION, support_replay
from treetune_verl.trainer.features import (
    EXTERNAL_LIB_KEY,
    PROCESS_SETUP_MODULE,
    WORKER_IMPL_KEY,
    RunFeatures,
    check_features,
    completion_target,
    has_process_setup,
)
from treetune_verl.verl.v0_7_1 import trainer_seams


@dataclass(frozen=True)
class TrainerRun:
    """What the trainer side creates for one run and hands down to the manager."""

    features: RunFeatures
    carry_over: CarryOver | None  # carry-over's buffer (custom.over_sample.carry_over), shared with the seams


def install(config: Any) -> TrainerRun:
    """Check the run's features, create its state and install the trainer's seams for them (idempotent).

    Raises:
        ValueError: a refused combination (both keys named), or support replay without our actor entry point.
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    replaying = support_replay(config.actor_rollout_ref.rollout)
    if replaying and OmegaConf.select(config, WORKER_IMPL_KEY, default="auto") == "disable":
        raise ValueError(f"support replay covers verl's legacy FSDP actor only ({WORKER_IMPL_KEY})")
    if replaying and not has_process_setup(config):
        raise ValueError(
            f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}.mode=support replays each token's sampled support in verl 0.7.1's "
            f"actor (verl/v0_7_1/support_replay.py), installed by our actor entry point: set {EXTERNAL_LIB_KEY}="
            f"{PROCESS_SETUP_MODULE} (or custom.{ENTROPY_SECTION}.replay=false)"
        )
    features = check_features(config, rollout_entropy=True)
    carry_over = None
    if features.carry_over:
        # verl 0.7.1's dataloader batch (ray_trainer._create_dataloader): the groups of every step
        slots = int(config.data.get("gen_batch_size", config.data.train_batch_size))
        most_carried = slots - completion_target(features.over_sample_rate, slots)
        carry_over = CarryOver(features.max_staleness, slots, most_carried)
    trainer_seams.install(features, carry_over)
    return TrainerRun(features, carry_over)
