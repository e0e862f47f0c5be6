# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The names of the fields per-token entropy travels in on the verl side, from the agent loops to the trainer.

Entropy*AgentLoop  -> AgentLoopOutput.extra_fields[RESPONSE_ENTROPY_KEY]  list[float], len(response_ids)
EntropyAgentLoopWorker -> DataProto.batch[ROLLOUT_ENTROPY_KEY]            float32 [batch, response_length]
"""

from treetune_verl.ppo.loss_aggregation import ABORTED_KEY

RESPONSE_ENTROPY_KEY = "response_entropy"  # AgentLoopOutput.extra_fields, loop -> worker (popped by the worker)
ROLLOUT_ENTROPY_KEY = "rollout_entropy"  # DataProto.batch, float32 [batch, response_length], nats
# DataProto.batch, bool [batch]: False for rows whose loop carries no entropy (a stock verl loop). Their
# rollout_entropy row is all 0.0, which is not a measured entropy: metrics and consumers must leave them out.
HAS_ROLLOUT_ENTROPY_KEY = "has_rollout_entropy"
# DataProto.batch, bool [batch]: True for rows cut by over-sampling with abort (rollout.over_sample_rate > 0). Such a
# row carries nothing into training: its response is empty (attention and response_mask 0) and its reward is 0.
# The actor's loss patch (treetune_verl.ppo.loss_aggregation) reads the same key: one name, defined there.
ROLLOUT_ABORTED_KEY = ABORTED_KEY
