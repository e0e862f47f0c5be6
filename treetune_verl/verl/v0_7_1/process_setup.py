# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1: what ``treetune_verl.verl.process_setup`` installs in verl's processes.

Every actor seam (``actor_seams.py``; each feature inert unless its data or settings are there), and the
``grpo_valid`` / ``rloo_valid`` estimators (used in the trainer's process, which imports ``treetune_verl.ppo.advantage``
itself). It refuses the new worker implementation (``trainer.use_legacy_worker_impl=disable``), whose actor the seams
do not reach: that worker's module, ``verl.workers.engine_workers``, is already imported in the process that builds
its ``HFModelConfig`` (``engine_workers.py`` ``ActorRolloutRefWorker.init_model``); the legacy path never imports it.
"""

from __future__ import annotations

import sys

from treetune_verl.verl_guard import VERL

NEW_WORKER_MODULE = "verl.workers.engine_workers"
ENTRY_POINT = "treetune_verl.verl.process_setup"


def install() -> None:
    """Register the estimators and install the legacy actor's seams in this process (idempotent).

    Raises:
        RuntimeError: this process runs verl's new worker implementation.
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    VERL.require("actor hooks")
    from treetune_verl.ppo import advantage  # noqa: F401  (registers the estimators; harmless here)
    from treetune_verl.verl.v0_7_1 import actor_seams

    if NEW_WORKER_MODULE in sys.modules:
        raise RuntimeError(
            f"{ENTRY_POINT} handles verl's legacy FSDP actor only (DataParallelPPOActor), but this process runs the "
            f"new worker implementation ({NEW_WORKER_MODULE}): set trainer.use_legacy_worker_impl=auto (the default) "
            f"or enable, or do not name {ENTRY_POINT} in actor_rollout_ref.model.external_lib."
        )
    actor_seams.install()
