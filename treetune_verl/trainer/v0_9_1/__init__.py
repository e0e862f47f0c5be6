# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The trainer side on verl 0.9.1 (its default "V1" trainer, ``verl/trainer/ppo/v1/``, on TransferQueue).

- ``process_setup``: imported through ``actor_rollout_ref.model.external_lib=treetune_verl.trainer.actor_setup`` in
  every verl process that builds the model config; selects our server where verl builds the rollout servers.
- ``trainer_seams``: the V1 trainer's hooks (rollout entropy into TransferQueue, its metrics, validation, timing).
- ``entropy_rows``: each row's ``rollout_entropy`` from what the agent loop left in its ``extra_fields``.

Spec: ``treetune_specs/2026-11-24-current-stack-trainer.md``. Importing this package imports nothing.
"""
