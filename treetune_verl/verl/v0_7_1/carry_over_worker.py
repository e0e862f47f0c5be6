# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The carry-over feature of verl 0.7.1's ``AgentLoopWorker``: resume carried rows, record what aborted rows made.

When the step's plan carries over (``carry_over.py``):

- a row that brings a :class:`~treetune_verl.agent_loop.carry_over.CarriedRow` (``non_tensor_batch
  ["treetune_carried_row"]``, put there by the manager) runs the continuation loop (``continuation_agent_loop.py``)
  instead of its own;
- an aborted row (not a failed one) leaves what it generated, before the row is emptied, in
  ``non_tensor_batch["treetune_carry_record"]``: its tokens, behaviour log-probs, entropy, and the step of each token.

Outermost of the worker's features (``worker.py``): it must see a row's tokens and entropy before rollout entropy
pops the entropy and over-sampling empties an aborted row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker, _InternalAgentLoopOutput
from verl.protocol import DataProto

from treetune_verl.agent_loop.carry_over import carried_row
from treetune_verl.agent_loop.continuation_agent_loop import CONTINUATION_AGENT
from treetune_verl.agent_loop.trajectory import CURRENT_TRAJECTORY
from treetune_verl.batch_keys import (
    CARRIED_ROW_KEY,
    CARRY_RECORD_KEY,
    RESPONSE_ENTROPY_KEY,
    RESUME_KEY,
    ROLLOUT_ABORTED_KEY,
    ROLLOUT_FAILED_KEY,
)
from treetune_verl.timing import OVER_SAMPLING, SECONDS


class CarryOverWorker(AgentLoopWorker):
    """Resumes carried rows and records aborted ones when the batch's plan carries over (module docstring)."""

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any):
        if kwargs.get(CARRIED_ROW_KEY) is not None:
            kwargs["agent_name"] = CONTINUATION_AGENT
        return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)

    async def _agent_loop_postprocess(self, output: AgentLoopOutput, **kwargs: Any) -> _InternalAgentLoopOutput:
        resume = output.extra_fields.pop(RESUME_KEY, None)
        trajectory = CURRENT_TRAJECTORY.get()
        step = trajectory.step if trajectory is not None else None
        if step is None or not step.carry_over:
            return await super()._agent_loop_postprocess(output, **kwargs)
        entropy = output.extra_fields.get(RESPONSE_ENTROPY_KEY)  # popped by rollout entropy below
        made = (output.prompt_ids, output.response_ids, output.response_logprobs, entropy and list(entropy))
        internal = await super()._agent_loop_postprocess(output, **kwargs)
        if internal.extra_fields.get(ROLLOUT_ABORTED_KEY) and not internal.extra_fields.get(ROLLOUT_FAILED_KEY):
            with SECONDS.timed(OVER_SAMPLING):
                internal.extra_fields[CARRY_RECORD_KEY] = carried_row(
                    *made,
                    resume=resume,
                    resumed=kwargs.get(CARRIED_ROW_KEY),
                    step=step.global_step,
                    response_length=self.rollout_config.response_length,
                )
        return internal

    def _postprocess(
        self, inputs: list[_InternalAgentLoopOutput], input_non_tensor_batch: dict | None = None
    ) -> DataProto:
        records = np.empty(len(inputs), dtype=object)
        records[:] = [item.extra_fields.pop(CARRY_RECORD_KEY, None) for item in inputs]
        data = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch)
        # the manager hands every carrying batch a resume column: then every worker's output has the records column
        if input_non_tensor_batch is not None and CARRIED_ROW_KEY in input_non_tensor_batch:
            data.non_tensor_batch[CARRY_RECORD_KEY] = records
        return data
