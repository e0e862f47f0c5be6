# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's tool agent loop, with the served per-token entropy carried next to the response.

On the entropy's path it sits between the server's ``EntropyTokenOutput`` (seen through ``EntropyRecorder``) and
the worker; tool and user tokens get 0.0, model turns their served values. Registered as ``entropy_tool_agent``.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.agent_loop.recorder import EntropyRecorder, attach_response_entropy
from treetune_verl.rollout.token_output import ABORTED_STOP_REASON
from treetune_verl.verl_guard import VERL

# verl 0.9.1 merges turns with Continuous Tokens (trim, insert): its loop is verl/v0_9_1/entropy_tool_agent_loop.py.
VERL.require("tool loop (pure-append turns)")

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register  # noqa: E402
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop  # noqa: E402

AGENT_DATA_ENTROPY_ATTR = "response_entropy"  # list[float] on AgentData, aligned with AgentData.response_mask


@register("entropy_tool_agent")
class EntropyToolAgentLoop(ToolAgentLoop):
    """``ToolAgentLoop`` whose output also holds ``extra_fields["response_entropy"]``, aligned with the response.

    Each state handler of the parent runs unchanged; afterwards exactly the tokens it appended to
    ``response_mask`` get an entropy: the served values for a model turn, 0.0 for tool and user (interaction)
    tokens. A tool response that would overflow ``response_length`` is dropped by the parent without appending,
    so nothing is added then. The result is truncated to ``response_length`` like ``response_ids``.

    The list lives on ``AgentData`` as an attribute, not in ``agent_data.extra_fields``: the parent copies the
    server's ``extra_fields`` (``global_steps``) into that dict only while it is empty.

    Two fixes of the parent for aborted requests (over-sampling): a turn whose request was aborted ends the
    trajectory (the parent would parse the partial text for tool calls and go on), and a trajectory without any
    response token returns an empty response (the parent's ``prompt_ids[-0:]`` returns the whole prompt).

    Example (``m`` model token, ``t`` tool token, ``u`` user token)::

        response_mask:    1    1    0 0 0  1    0 0  1
        response_entropy: 0.7  1.2  0 0 0  0.4  0 0  2.1
                          m    m    t t t  m    u u  m
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_manager = EntropyRecorder(self.server_manager)
        self._agent_data: AgentData | None = None  # one loop object per sample (verl instantiates per sample)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        if not output.response_mask:
            output.response_ids = []
        attach_response_entropy(output, getattr(self._agent_data, AGENT_DATA_ENTROPY_ATTR, []), self.response_length)
        return output

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        start = len(agent_data.response_mask)
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        self._extend(agent_data, start, self.server_manager.take())
        if self.server_manager.last_stop_reason == ABORTED_STOP_REASON:
            return AgentState.TERMINATED
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        start = len(agent_data.response_mask)
        state = await super()._handle_processing_tools_state(agent_data)
        self._extend(agent_data, start, None)
        return state

    async def _handle_interacting_state(self, agent_data: AgentData) -> AgentState:
        start = len(agent_data.response_mask)
        state = await super()._handle_interacting_state(agent_data)
        self._extend(agent_data, start, None)
        return state

    def _extend(self, agent_data: AgentData, start: int, served: list[float] | None) -> None:
        """Give the ``response_mask`` growth since ``start`` its entropy (``served``, or 0.0 when ``None``)."""
        self._agent_data = agent_data
        entropy: list[float] = agent_data.__dict__.setdefault(AGENT_DATA_ENTROPY_ATTR, [])
        grown = len(agent_data.response_mask) - start
        if len(entropy) != start:
            raise RuntimeError(f"entropy/response_mask misaligned before a turn: {len(entropy)} != {start}")
        if served is None:
            served = [0.0] * grown
        elif len(served) != grown:
            raise RuntimeError(f"{len(served)} entropies served for {grown} response tokens appended")
        entropy.extend(served)
