# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl's PPO side of over-sampling with abort: aborted rollouts (``response_mask`` all 0) carry no signal.

- ``advantage``: the estimators ``grpo_valid`` / ``rloo_valid``, verl's GRPO / RLOO over each group's completed rows.
- ``loss_aggregation``: the legacy FSDP actor's loss normalised over a mini-batch's completed rows, never NaN.
- ``entropy_advantage``: entropy steering (forking-token mask, entropy-shaped advantage) and its settings.

The seams that call them live in ``treetune_verl/verl/v*/`` (installed by ``treetune_verl.verl.process_setup``, named in
``external_lib``).

Importing this package imports nothing (no verl): each module is imported where it is needed.
"""
