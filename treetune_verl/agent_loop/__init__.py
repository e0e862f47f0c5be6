# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The verl side's agent loops: per-token entropy from the server's output into ``DataProto.batch["rollout_entropy"]``.

Along the entropy's path: ``recorder`` (a loop sees what its server served) -> ``entropy_single_turn_agent_loop`` /
``entropy_tool_agent_loop`` (``extra_fields["response_entropy"]``, aligned with ``response_ids``) ->
``entropy_worker`` (``batch["rollout_entropy"]``, ``[batch, response_length]``), combined with over-sampling in
``worker`` -> ``entropy_manager`` (selected by the Hydra block; logs ``treetune_verl/trainer/metrics``).
``treetune_verl/batch_keys.py`` names the keys. Importing this package registers the agent loops
``entropy_single_turn_agent`` and ``entropy_tool_agent`` in verl's registry; it does not import sglang.
Spec: ``treetune_specs/2026-11-22-verl-rollout-entropy.md``; map: ``agent-docs/architecture.md``.
"""

from treetune_verl.agent_loop.entropy_manager import EntropyAgentLoopManager
from treetune_verl.agent_loop.entropy_single_turn_agent_loop import EntropySingleTurnAgentLoop
from treetune_verl.agent_loop.entropy_tool_agent_loop import EntropyToolAgentLoop
from treetune_verl.agent_loop.entropy_worker import RolloutEntropyWorker, pad_response_entropy
from treetune_verl.agent_loop.recorder import EntropyRecorder
from treetune_verl.agent_loop.worker import EntropyAgentLoopWorker
from treetune_verl.batch_keys import HAS_ROLLOUT_ENTROPY_KEY, RESPONSE_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.rollout.rollout_config import check_rollout_config, entropy_config
from treetune_verl.rollout.token_output import EntropyTokenOutput
from treetune_verl.trainer.metrics import rollout_entropy_metrics

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
    "pad_response_entropy",
    "rollout_entropy_metrics",
]
