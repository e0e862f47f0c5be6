# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The agent loop that resumes a carried row (over-sampling with carry-over, ``carry_over.py``).

The worker runs it instead of the row's own loop when the row brings a :class:`~treetune_verl.agent_loop.carry_over.
CarriedRow` (``carry_over_worker.py``). A finished row is returned as it was; a cut one is continued: one request of
its prompt and partial tokens with its own request's sampling parameters and the budget left (its ``max_new_tokens``,
at most ``response_length``, minus the tokens it has), under the current weights, and the parts stitched: tokens,
behaviour log-probs and entropy each the concatenation of the carried part and the new one. Registered as
``treetune_continuation``.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register

from treetune_verl.agent_loop.carry_over import CarriedRow, token_budget
from treetune_verl.agent_loop.entropy_single_turn_agent_loop import EntropySingleTurnAgentLoop
from treetune_verl.batch_keys import CARRIED_ROW_KEY, RESPONSE_ENTROPY_KEY, RESUME_KEY

CONTINUATION_AGENT = "treetune_continuation"


@register(CONTINUATION_AGENT)
class ContinuationAgentLoop(EntropySingleTurnAgentLoop):
    """Resumes ``kwargs["treetune_carried_row"]``; the output as ``entropy_single_turn_agent``'s (its stop reason
    included, so the row can be carried again)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """``sampling_params`` (the batch's) are not used: the row continues with its own request's."""
        row: CarriedRow = kwargs[CARRIED_ROW_KEY]
        response_ids, log_probs, entropy = list(row.response_ids), list(row.log_probs), list(row.entropy)
        stop_reason = "stop"  # a finished row's, as it was carried (anything but "abort")
        budget = token_budget(row.sampling_params, self.response_length) - len(response_ids)
        metrics: dict[str, Any] = {}
        # the server's extra fields, as the single-turn loop passes them on: every worker's batch must have the same
        # columns (verl concatenates them), also one whose rows are all finished carried rows
        served: dict[str, Any] = {"global_steps": None}
        if not row.finished and budget > 0:
            params = {k: v for k, v in row.sampling_params.items() if k not in ("max_new_tokens", "max_tokens")}
            output = await self.server_manager.generate(
                request_id=uuid4().hex,
                prompt_ids=list(row.prompt_ids) + response_ids,
                sampling_params={**params, "max_new_tokens": budget},
            )
            response_ids += list(output.token_ids[:budget])
            log_probs += list(output.log_probs[:budget])
            entropy += self.server_manager.take()[:budget]
            stop_reason = output.stop_reason
            served.update(output.extra_fields)
            metrics["num_preempted"] = output.num_preempted if output.num_preempted is not None else -1
        return AgentLoopOutput(
            prompt_ids=list(row.prompt_ids),
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            response_logprobs=log_probs,
            num_turns=2,
            metrics=metrics,
            extra_fields={
                **served,
                RESPONSE_ENTROPY_KEY: entropy,
                # the row's own request parameters again: cut once more, it resumes with the same budget
                RESUME_KEY: {"stop_reason": stop_reason, "sampling_params": dict(row.sampling_params)},
                "turn_scores": [],
                "tool_rewards": [],
            },
        )
