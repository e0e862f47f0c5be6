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

from treetune_verl.agent_loop.carry_over import CarryOver
from treetune_verl.rollout.rollout_config import CONFIG_PATH, ENTROPY_SECTION, entropy_config
from treetune_verl.trainer.features import RunFeatures, check_features
from treetune_verl.verl.v0_7_1 import trainer_seams


@dataclass(frozen=True)
class TrainerRun:
    """What the trainer side creates for one run and hands down to the manager."""

    features: RunFeatures
    carry_over: CarryOver | None  # carry-over's buffer (custom.over_sample.carry_over), shared with the seams


def install(config: Any) -> TrainerRun:
    """Check the run's features, create its state and install the trainer's seams for them (idempotent).

    Raises:
        ValueError: a refused combination (both keys named), or entropy mode ``support`` (not replayed here yet).
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    if entropy_config(config.actor_rollout_ref.rollout).mode == "support":
        raise ValueError(
            f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}.mode=support: verl 0.7.1's actor does not replay the sampled "
            "support yet (issue 48; verl 0.9.1's does: verl/v0_9_1/support_replay.py). Use 'raw' or 'tempered'."
        )
    features = check_features(config, rollout_entropy=True)
    carry_over = CarryOver(features.max_staleness) if features.carry_over else None
    trainer_seams.install(features, carry_over)
    return TrainerRun(features, carry_over)
