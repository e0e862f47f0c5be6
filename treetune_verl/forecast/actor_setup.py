# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Deprecated (one release): name ``treetune_verl.trainer.actor_setup`` in ``actor_rollout_ref.model.external_lib``.

The same as ``treetune_verl.ppo.actor_setup``, the other deprecated alias: warns and installs every actor seam.
"""

from treetune_verl.ppo import actor_setup  # noqa: F401  (warns, then imports treetune_verl.trainer.actor_setup)
