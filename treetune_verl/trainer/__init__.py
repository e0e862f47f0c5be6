# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Everything treetune runs inside verl's training processes, one seam per upstream hook, features in a stated order.

- ``features``: which features a run's config turns on, and the start-up refusals of how they combine.
- ``trainer_seams``: the hooks in the trainer's process (``RayPPOTrainer``: ``_compute_old_log_prob``,
  ``extract_reward``, ``compute_advantage``, ``compute_data_metrics``, ``_val_metrics_update``).
- ``actor_seams``: the hooks in the actor workers (``ActorRolloutRefWorker.update_actor``,
  ``DataParallelPPOActor.update_policy`` and its ``_optimizer_step``, ``agg_loss``, the rollout-correction metrics).
- ``trainer_setup`` / ``actor_setup``: the two entry points (the manager calls the first in the trainer's process;
  ``actor_rollout_ref.model.external_lib=treetune_verl.trainer.actor_setup`` imports the second in the actors).
- ``metrics``: the per-step metrics those seams and the agent-loop manager log.

Importing this package imports nothing (no verl): each module is imported where it is needed.
"""
