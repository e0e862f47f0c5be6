# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The verl side's agent loops: per-token entropy from the server's output into ``DataProto.batch["rollout_entropy"]``.

Along the entropy's path: ``recorder`` (a loop sees what its server served) -> ``entropy_single_turn_agent_loop``
(``extra_fields["response_entropy"]``, aligned with ``response_ids``) -> ``entropy_worker`` (``batch["rollout_entropy"]``,
``[batch, response_length]``); the features shared by both verl versions' workers (``over_sample``, ``carry_over``,
``continuation_agent_loop``, ``trajectory``, ``loop_registry``). What one verl version needs (the block's manager, the
tool loop, the workers that combine the features) is in ``treetune_verl/verl/v0_7_1/`` and ``v0_9_1/``, its public
names served by ``treetune_verl.verl`` (``EntropyAgentLoopManager``, ``EntropyToolAgentLoop``).
``treetune_verl/batch_keys.py`` names the keys. Importing a loop's module registers it in verl's registry
(``entropy_single_turn_agent``); the names below are imported on first use. No sglang import.
Spec: ``treetune_specs/2026-11-22-verl-rollout-entropy.md``; map: ``agent-docs/architecture.md``.
"""

from treetune_verl.lazy_exports import lazy_exports

_WHERE = {
    "EntropySingleTurnAgentLoop": "treetune_verl.agent_loop.entropy_single_turn_agent_loop",
    "RolloutEntropyWorker": "treetune_verl.agent_loop.entropy_worker",
    "EntropyRecorder": "treetune_verl.agent_loop.recorder",
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
    "EntropyRecorder",
    "EntropySingleTurnAgentLoop",
    "EntropyTokenOutput",
    "RolloutEntropyWorker",
    "check_rollout_config",
    "entropy_config",
    "rollout_entropy_metrics",
]
