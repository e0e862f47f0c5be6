# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1 agent loops that carry sglang's per-token entropy into ``DataProto.batch["rollout_entropy"]``.

Turned on for a stock verl run by the override block in ``treetune_verl/config/grpo_entropy_overrides.txt``
(spec: ``treetune_specs/2026-11-22-verl-rollout-entropy.md``). Importing this package registers the agent loops
``entropy_single_turn_agent`` and ``entropy_tool_agent`` in verl's registry; it does not import sglang.
"""

from treetune_verl.agent_loop.entropy_manager import EntropyAgentLoopManager, rollout_entropy_metrics
from treetune_verl.agent_loop.entropy_output import (
    RESPONSE_ENTROPY_KEY,
    ROLLOUT_ENTROPY_KEY,
    EntropyRecorder,
    EntropyTokenOutput,
    check_rollout_config,
    entropy_config,
)
from treetune_verl.agent_loop.entropy_single_turn_agent_loop import EntropySingleTurnAgentLoop
from treetune_verl.agent_loop.entropy_tool_agent_loop import EntropyToolAgentLoop
from treetune_verl.agent_loop.entropy_worker import EntropyAgentLoopWorker, pad_response_entropy

__all__ = [
    "RESPONSE_ENTROPY_KEY",
    "ROLLOUT_ENTROPY_KEY",
    "EntropyAgentLoopManager",
    "EntropyAgentLoopWorker",
    "EntropyRecorder",
    "EntropySingleTurnAgentLoop",
    "EntropyTokenOutput",
    "EntropyToolAgentLoop",
    "check_rollout_config",
    "entropy_config",
    "pad_response_entropy",
    "rollout_entropy_metrics",
]
