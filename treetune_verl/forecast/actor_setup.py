# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Import this in verl's actor workers: ``actor_rollout_ref.model.external_lib=treetune_verl.forecast.actor_setup``.

Everything ``treetune_verl.ppo.actor_setup`` installs (the loss fix for aborted rows and its guards; it refuses the new
worker implementation), plus the entropy forecast's worker patch (``worker_hook.py``), which does nothing unless
``actor_rollout_ref.rollout.custom.entropy_forecast`` is set (the ``+treetune_forecast=entropy_forecast`` block sets
both).
"""

from __future__ import annotations

from treetune_verl.forecast import worker_hook
from treetune_verl.ppo import actor_setup  # noqa: F401  (installs the loss patches)

worker_hook.install()
