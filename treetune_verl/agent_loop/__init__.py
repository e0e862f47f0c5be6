# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The verl side's agent loops: per-token entropy from the server's output into ``DataProto.batch["rollout_entropy"]``.

Along the entropy's path: ``recorder`` (a loop sees what its server served) -> ``entropy_single_turn_agent_loop`` /
``entropy_tool_agent_loop`` (``extra_fields["response_entropy"]``, aligned with ``response_ids``) ->
``entropy_worker`` (``batch["rollout_entropy"]``, ``[batch, response_length]``), combined with over-sampling in
``worker`` -> ``entropy_manager`` (selected by the Hydra block; logs ``treetune_verl/trainer/metrics``).
``treetune_verl/batch_keys.py`` names the keys. Importing a loop's module registers it in verl's registry
(``entropy_single_turn_agent``, ``entropy_tool_agent``); the names below are imported on first use, so that the
version-independent modules (``recorder``, ``trajectory``) import without verl 0.7.1's agent loop. No sglang import.
Spec: ``treetune_specs/2026-11-22-verl-rollout-entropy.md``; map: ``agent-docs/architecture.md``.
"""

from treetune_verl.lazy_exports import lazy_exports
from treetune_verl.verl_guard import on_current_stack

_WHERE = {
    # The block's manager class: verl 0.9.1's V1 trainer needs another one (entropy_manager_tq.py).
    "EntropyAgentLoopManager": (
        "treetune_verl.agent_loop.entropy_manager_tq"
        if on_current_stack()
        else "treetune_verl.agent_loop.entropy_manager"
    ),
    "EntropySingleTurnAgentLoop": "treetune_verl.agent_loop.entropy_single_turn_agent_loop",
    # verl 0.9.1's tool loop merges turns with Continuous Tokens: its own class (the loops YAML names this one).
    "EntropyToolAgentLoop": (
        "treetune_verl.agent_loop.entropy_tool_agent_loop_v0_9_1"
        if on_current_stack()
        else "treetune_verl.agent_loop.entropy_tool_agent_loop"
    ),
    "RolloutEntropyWorker": "treetune_verl.agent_loop.entropy_worker",
    "EntropyRecorder": "treetune_verl.agent_loop.recorder",
    "EntropyAgentLoopWorker": "treetune_verl.agent_loop.worker",
    "HAS_ROLLOUT_ENTROPY_KEY": "treetune_verl.batch_keys",
    "RESPONSE_ENTROPY_KEY": "treetune_verl.batch_keys",
    "ROLLOUT_ENTROPY_KEY": "treetune_verl.batch_keys",
    "check_rollout_config": "treetune_verl.rollout.rollout_config",
    "entropy_config": "treetune_verl.rollout.rollout_config",
    "EntropyTokenOutput": "treetune_verl.rollout.token_output",
    "rollout_entropy_metrics": "treetune_verl.trainer.metrics",
}
__getattr__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "HAS_ROLLOUT_ENTROPY_KEY",
    "RESPONSE_ENTROPY_KEY",
    "ROLLOUT_ENTROPY_KEY",
    "EntropyAgentLoopManager",
    "EntropyAgentLoopWorker",
    "EntropyRecorder",
    "EntropySingleTurnAgentLoop",
    "EntropyTokenOutput",
    "EntropyToolAgentLoop",
    "RolloutEntropyWorker",
    "check_rollout_config",
    "entropy_config",
    "rollout_entropy_metrics",
]
