# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1: the generation job's rollout (``backend=verl``): the block's ``EntropyAgentLoopManager`` in verl's
standalone rollout mode (no trainer, no actor): it starts the ``EntropySGLangHttpServer`` replicas and the
``EntropyAgentLoopWorker`` actors itself. ``generate_sequences(DataProto) -> DataProto`` with ``rollout_entropy``.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.verl_guard import VERL

VERL.require("generation rollout (backend=verl; verl 0.9.1's: treetune_verl/verl/v0_9_1)")

# What verl 0.7.1's standalone rollout needs beyond the job's composed config: nothing (its server loads the real
# weights in standalone mode itself, ``async_sglang_server.py:110``).
OVERRIDES: list[str] = []


def start(config: Any) -> Any:
    """The servers and workers of a standalone rollout of ``config`` (verl's whole trainer config) on the running Ray
    cluster: an object with verl's ``generate_sequences(DataProto) -> DataProto``. Ray's shutdown ends them."""
    from treetune_verl.verl.v0_7_1.entropy_manager import EntropyAgentLoopManager

    return EntropyAgentLoopManager.create(config)
