# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The trainer-side entry point: called by our agent-loop manager in the trainer's process with verl's whole config.

:func:`install` refuses what cannot run (``features.check_features``: a feature without its prerequisite, or with a
verl setting it does not cover, naming both keys), then installs the trainer's seams (``trainer_seams.py``) with the
run's features, read from this config: the trainer acts on its own settings, nothing travels through the rollout.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.trainer.features import RunFeatures, check_features
from treetune_verl.verl.v0_7_1 import trainer_seams


def install(config: Any) -> RunFeatures:
    """Check the run's features and install the trainer's seams for them (idempotent); returns the features.

    Raises:
        ValueError: a refused combination (both keys named).
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    features = check_features(config, rollout_entropy=True)
    trainer_seams.install(features)
    return features
