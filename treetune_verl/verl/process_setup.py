# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The entry point verl imports in its processes: ``actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup``.

verl imports ``external_lib`` wherever it builds the model config (``HFModelConfig.__post_init__``: the trainer's
process, the agent-loop workers, the actor workers) and, on verl 0.7.1, in the legacy FSDP worker's ``init_model``
before it builds the actor. The actor's loss runs in those worker processes (Ray actors), not in the trainer's, so a
patch installed by the trainer never reaches it: this import is how our seams get there. What it installs is the
installed verl's ``process_setup.install()`` (``v0_7_1/process_setup.py``: the legacy actor's seams and the
``grpo_valid`` / ``rloo_valid`` estimators; ``v0_9_1/process_setup.py``: the engine-worker actor's seams, the entropy
loops' registry entries and, in the trainer's process, our server for the policy's rollout and the V1 trainer's
seams). Every block that needs a seam in those processes (rollout entropy on verl 0.9.1, over-sampling, the forecast)
names this one module, so they combine. Idempotent.
"""

from treetune_verl.verl import adapter

adapter("process_setup").install()
