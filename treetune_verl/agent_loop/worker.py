# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The agent-loop worker the manager runs: each worker-side feature a class of its own, combined in a stated order.

verl 0.7.1's ``AgentLoopWorker`` seams (``_run_agent_loop``, ``_agent_loop_postprocess``, ``_postprocess``,
``generate_sequences``) are overridden by each feature with ``super()`` calls, so the method resolution order is the
order they run in, outermost first:

1. rollout entropy (``entropy_worker.RolloutEntropyWorker``): pads each row's entropy once the row is final;
2. sessions and over-sampling with abort (``over_sample_worker.OverSamplingAgentLoopWorker``): names every
   trajectory's requests, claims a slot or aborts, empties an aborted row, marks ``rollout_aborted``;
3. verl's ``AgentLoopWorker``.

Importing this module registers the entropy agent loops in verl's registry of the worker's process.
"""

from __future__ import annotations

# Importing the loops registers their names in this process's verl agent-loop registry.
from treetune_verl.agent_loop import entropy_single_turn_agent_loop, entropy_tool_agent_loop  # noqa: F401
from treetune_verl.agent_loop.entropy_worker import RolloutEntropyWorker
from treetune_verl.agent_loop.over_sample_worker import OverSamplingAgentLoopWorker


class EntropyAgentLoopWorker(RolloutEntropyWorker, OverSamplingAgentLoopWorker):
    """``batch["rollout_entropy"]`` / ``has_rollout_entropy`` and ``batch["rollout_aborted"]`` (module docstring)."""
