# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Import this in verl's actor workers: ``actor_rollout_ref.model.external_lib=treetune_verl.trainer.actor_setup``.

The one actor-side entry point, whatever the run enables (the over-sampling and forecast blocks both name it, so
they combine): it installs every actor seam (``actor_seams.py``; each feature inert unless its data or settings are
there) and registers the ``grpo_valid`` / ``rloo_valid`` estimators (used in the trainer's process, which imports
``treetune_verl.ppo.advantage`` itself).

The actor's loss runs in verl's FSDP worker processes (Ray actors), not in the trainer's, so a patch installed by
the trainer never reaches it. verl's hook into those processes is ``external_lib``: the legacy FSDP worker imports
it in ``init_model`` (``verl/workers/fsdp_workers.py`` ``ActorRolloutRefWorker.init_model``), before it builds
``DataParallelPPOActor``; ``HFModelConfig.__post_init__`` imports it too wherever that config is built (the agent-loop
workers), which is harmless.

It refuses the new worker implementation (``trainer.use_legacy_worker_impl=disable``), whose actor the seams do not
reach: that worker's module, ``verl.workers.engine_workers``, is already imported in the process that builds its
``HFModelConfig`` (``engine_workers.py`` ``ActorRolloutRefWorker.init_model``); the legacy path never imports it.

On verl 0.9.1 (the current stack) the engine worker is the only actor (its seams:
``treetune_verl/trainer/v0_9_1/actor_seams.py``), and the same import is where the trainer's process selects our
server before verl starts it: ``treetune_verl/trainer/v0_9_1/process_setup.py``. There the rollout-entropy block
needs this module named too.
"""

from __future__ import annotations

import sys

from treetune_verl.verl_guard import on_current_stack

NEW_WORKER_MODULE = "verl.workers.engine_workers"

if on_current_stack():
    # verl 0.9.1: the engine worker is the only actor (its seams: the forecast); this also selects our server in the
    # trainer's process.
    from treetune_verl.trainer.v0_9_1 import actor_seams as engine_actor_seams
    from treetune_verl.trainer.v0_9_1 import process_setup

    engine_actor_seams.install()
    process_setup.install()
else:
    from treetune_verl.ppo import advantage  # noqa: F401  (registers the estimators; harmless here)
    from treetune_verl.trainer import actor_seams

    if NEW_WORKER_MODULE in sys.modules:
        raise RuntimeError(
            f"{__name__} handles verl's legacy FSDP actor only (DataParallelPPOActor), but this process runs the new "
            f"worker implementation ({NEW_WORKER_MODULE}): set trainer.use_legacy_worker_impl=auto (the default) or "
            f"enable, or do not name {__name__} in actor_rollout_ref.model.external_lib."
        )

    actor_seams.install()
