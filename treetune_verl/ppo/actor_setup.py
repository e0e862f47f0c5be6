# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Import this in verl's actor workers: ``actor_rollout_ref.model.external_lib=treetune_verl.ppo.actor_setup``.

The actor's loss runs in verl's FSDP worker processes (Ray actors), not in the trainer's, so a patch installed by
the trainer never reaches it. verl's hook into those processes is ``external_lib``: the legacy FSDP worker imports
it in ``init_model`` (``verl/workers/fsdp_workers.py`` ``ActorRolloutRefWorker.init_model``), before it builds
``DataParallelPPOActor``; ``HFModelConfig.__post_init__`` imports it too wherever that config is built (the agent-loop
workers), which is harmless. Importing this module installs :func:`treetune_verl.ppo.loss_aggregation.install`
(aborted rows carry no loss, never NaN) and :func:`treetune_verl.ppo.rollout_corr_guard.install` (no crash in
verl's per-micro-batch metrics on a micro-batch of aborted rows), and registers the ``grpo_valid`` / ``rloo_valid`` estimators (used in the
trainer's process, which must import ``treetune_verl.ppo.advantage`` itself).

It refuses the new worker implementation (``trainer.use_legacy_worker_impl=disable``), whose actor the patch does
not reach: that worker's module, ``verl.workers.engine_workers``, is already imported in the process that builds
its ``HFModelConfig`` (``engine_workers.py`` ``ActorRolloutRefWorker.init_model``); the legacy path never imports it.
"""

from __future__ import annotations

import sys

from treetune_verl.ppo import (
    advantage,  # noqa: F401  (registers the estimators; harmless here)
    loss_aggregation,
    rollout_corr_guard,
)

NEW_WORKER_MODULE = "verl.workers.engine_workers"

if NEW_WORKER_MODULE in sys.modules:
    raise RuntimeError(
        "treetune_verl.ppo.actor_setup handles verl's legacy FSDP actor only (DataParallelPPOActor), but this process "
        f"runs the new worker implementation ({NEW_WORKER_MODULE}): set trainer.use_legacy_worker_impl=auto (the "
        "default) or enable, or do not name treetune_verl.ppo.actor_setup in actor_rollout_ref.model.external_lib."
    )

loss_aggregation.install()
rollout_corr_guard.install()
