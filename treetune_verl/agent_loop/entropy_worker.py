# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The rollout-entropy feature of verl's DataProto ``AgentLoopWorker`` (verl 0.7.1's trainer; on verl 0.9.1 the
generation job's rollout): ``rollout_entropy`` in the generated ``DataProto``.

On the entropy's path it sits after the agent loops (whose ``extra_fields["response_entropy"]`` it pads to
``[1, response_length]`` per sample with ``rollout/entropy_row.py``) and before the manager, which concatenates the
workers' batches and logs the metrics. It knows no other feature: the worker the manager runs combines it with over-sampling (``worker.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker, _InternalAgentLoopOutput
from verl.protocol import DataProto

from treetune_verl.batch_keys import (
    HAS_ROLLOUT_ENTROPY_KEY,
    RESPONSE_ENTROPY_KEY,
    RESPONSE_SUPPORT_KEY,
    ROLLOUT_ENTROPY_KEY,
)
from treetune_verl.rollout.entropy_row import entropy_row
from treetune_verl.rollout.rollout_config import entropy_config
from treetune_verl.timing import ROLLOUT_ENTROPY, SECONDS

_SUPPORT_ROW = "treetune_support_row"  # a row's supports between the two overrides (popped before verl sees it)


class RolloutEntropyWorker(AgentLoopWorker):
    """Adds ``batch["rollout_entropy"]``: float32 ``[batch, response_length]``, nats, aligned with ``responses``.

    Non-zero exactly where a model-generated token sits (``response_mask == 1``, up to a served entropy of exactly
    0.0); 0.0 at tool/user tokens, at padding, and for samples from loops that carry no entropy. Those samples are
    marked ``False`` in ``batch["has_rollout_entropy"]`` (bool ``[batch]``): their zeros are not measured entropies,
    and the metrics leave them out. Both keys are always emitted. The row is multiplied by the final ``response_mask``,
    so a response another feature emptied (an aborted row) is all 0.0 too. In entropy mode ``support`` the rows'
    supports go to ``non_tensor_batch["response_support"]`` (object ``[batch]``; ``None`` for rows without), for the
    actor's replay (``verl/v0_7_1/support_replay.py``).

    Both overrides call the parent: ``response_entropy`` is popped from the loop's ``extra_fields`` before
    ``_agent_loop_postprocess`` (which would hand it to the reward workers) and the padded row is popped again
    before ``_postprocess`` (which turns every ``extra_fields`` key into an object array in ``non_tensor_batch``).
    """

    async def _agent_loop_postprocess(
        self, output: AgentLoopOutput, *args: Any, **kwargs: Any
    ) -> _InternalAgentLoopOutput:
        # *args: verl 0.9.1's DataProto worker passes ``validate`` too (the generation job's rollout runs it there)
        with SECONDS.timed(ROLLOUT_ENTROPY):
            entropy = output.extra_fields.pop(RESPONSE_ENTROPY_KEY, None)
            support = output.extra_fields.pop(RESPONSE_SUPPORT_KEY, None)  # entropy mode "support" (issue 48)
            length = self.rollout_config.response_length
            row = entropy_row(entropy, len(output.response_ids), length, "an agent loop's output").unsqueeze(0)
        internal = await super()._agent_loop_postprocess(output, *args, **kwargs)
        with SECONDS.timed(ROLLOUT_ENTROPY):
            row *= internal.response_mask.to(row.dtype)  # 0.0 wherever no model token is (also once a row is emptied)
            internal.extra_fields[ROLLOUT_ENTROPY_KEY] = row
            internal.extra_fields[HAS_ROLLOUT_ENTROPY_KEY] = entropy is not None
            internal.extra_fields[_SUPPORT_ROW] = support
        return internal

    def _postprocess(
        self, inputs: list[_InternalAgentLoopOutput], input_non_tensor_batch: dict | None = None, **kwargs: Any
    ) -> DataProto:
        with SECONDS.timed(ROLLOUT_ENTROPY):
            response_length = self.rollout_config.response_length
            rows = [item.extra_fields.pop(ROLLOUT_ENTROPY_KEY, None) for item in inputs]
            rows = [row if row is not None else torch.zeros(1, response_length) for row in rows]
            has_entropy = [bool(item.extra_fields.pop(HAS_ROLLOUT_ENTROPY_KEY, False)) for item in inputs]
            supports = np.empty(len(inputs), dtype=object)  # object [B]: each row's list of supports, or None
            for i, item in enumerate(inputs):
                supports[i] = item.extra_fields.pop(_SUPPORT_ROW, None)
        data = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, **kwargs)  # 0.9.1: validate
        with SECONDS.timed(ROLLOUT_ENTROPY):
            data.batch[ROLLOUT_ENTROPY_KEY] = torch.cat(rows, dim=0)
            data.batch[HAS_ROLLOUT_ENTROPY_KEY] = torch.tensor(has_entropy, dtype=torch.bool)
            if entropy_config(self.rollout_config).mode == "support":  # every worker's chunk: the manager concatenates
                data.non_tensor_batch[RESPONSE_SUPPORT_KEY] = supports
        return data
