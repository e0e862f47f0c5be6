# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Deprecated (one release): name ``treetune_verl.trainer.actor_setup`` in ``actor_rollout_ref.model.external_lib``.

Importing this module warns and imports that one, which installs every actor seam (the over-sampling loss fix, the
rollout-correction guard and the forecast), so runs that still name this module train as before. The import goes
through ``importlib`` by name: the trainer layer comes after this one, and only this alias reaches up to it.
"""

from __future__ import annotations

import importlib
import warnings

warnings.warn(
    "treetune_verl.ppo.actor_setup and treetune_verl.forecast.actor_setup are deprecated: set "
    "actor_rollout_ref.model.external_lib=treetune_verl.trainer.actor_setup (one entry point for every feature)",
    DeprecationWarning,
    stacklevel=2,
)
importlib.import_module("treetune_verl.trainer.actor_setup")
