# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1's tool agent loop, with the served per-token entropy carried next to the response.

The current stack's ``entropy_tool_agent`` (registered by name in ``treetune_verl/verl/v0_9_1/process_setup.py``;
verl 0.7.1's is ``entropy_tool_agent_loop.py``). verl 0.9.1 builds every turn's tokens with Continuous Token merges,
which may trim tokens at the prefix boundary and insert boundary tokens before they append a turn; verl aligns
``response_mask`` and the log-probs of the result with ``align_response_metadata``. The entropy goes through the very
same call, as one more per-token list, so it stays aligned whatever the merge did.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.agent_loop.recorder import EntropyRecorder, attach_response_entropy
from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("Continuous Token tool loop")  # verl 0.7.1's tool loop is entropy_tool_agent_loop.py

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput  # noqa: E402
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop  # noqa: E402


class EntropyToolAgentLoop(ToolAgentLoop):
    """verl 0.9.1's ``ToolAgentLoop`` whose output also holds ``extra_fields["response_entropy"]`` (nats, one value
    per response token, truncated to ``response_length`` like ``response_ids``).

    Each merge's entropy is what ``align_response_metadata`` gives for it: a model turn's served values for its
    appended tokens, 0.0 for inserted boundary tokens and for tool / context tokens, the trimmed tokens' values
    dropped. A merge counts once the parent adopts it (``agent_data.response_mask`` is then the very list the merge
    returned): a tool turn that would overflow ``response_length`` is dropped by the parent, and so is its entropy.

    Example (``m`` model token, ``t`` tool token, ``b`` inserted boundary token)::

        response_mask:    1    1    0 0 0  0  1
        response_entropy: 0.7  1.2  0 0 0  0  2.1
                          m    m    t t t  b  m
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_manager = EntropyRecorder(self.server_manager)
        self._entropy: list[float] = []  # aligned with the adopted response_mask (one loop object per sample)
        self._proposed: tuple[list[int], list[float]] | None = None  # the last merge's (mask, entropy)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        attach_response_entropy(output, self._entropy, self.response_length)
        return output

    async def ct_merge_assistant_token(
        self,
        runtime_token_ids: list[int],
        assistant_token_ids: list[int],
        response_mask: list[int],
        response_logprobs: list[float] | None = None,
        assistant_logprobs: list[float] | None = None,
    ):
        result = await super().ct_merge_assistant_token(
            runtime_token_ids, assistant_token_ids, response_mask, response_logprobs, assistant_logprobs
        )
        self._propose(result, response_mask, self.server_manager.take())
        return result

    async def ct_merge_context_msg(
        self,
        previous_messages: list[dict],
        updated_messages: list[dict],
        runtime_token_ids: list[int],
        response_mask: list[int],
        response_logprobs: list[float] | None = None,
        tools: list[dict] | None = None,
    ):
        result = await super().ct_merge_context_msg(
            previous_messages, updated_messages, runtime_token_ids, response_mask, response_logprobs, tools
        )
        self._propose(result, response_mask, None)
        return result

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        self._adopt(agent_data)
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        state = await super()._handle_processing_tools_state(agent_data)
        self._adopt(agent_data)
        return state

    def _propose(self, result: tuple[Any, list[int], Any], response_mask: list[int], served: list[float] | None):
        """The merge's entropy, aligned by verl's own ``align_response_metadata`` (``served``: a model turn's)."""
        merge_result, aligned_mask, _ = result
        if len(self._entropy) != len(response_mask):
            raise RuntimeError(
                f"entropy/response_mask misaligned before a merge: {len(self._entropy)} != {len(response_mask)}"
            )
        _, entropy = self.continuous_token_builder.align_response_metadata(
            merge_result, response_mask, self._entropy, assistant_logprobs=served
        )
        self._proposed = (aligned_mask, entropy)

    def _adopt(self, agent_data: AgentData) -> None:
        """Keep the last merge's entropy if the parent kept its mask; then entropy and mask must align."""
        if self._proposed is not None and agent_data.response_mask is self._proposed[0]:
            self._entropy = self._proposed[1]
        self._proposed = None
        if len(self._entropy) != len(agent_data.response_mask):
            raise RuntimeError(
                f"entropy/response_mask misaligned after a turn: {len(self._entropy)} != {len(agent_data.response_mask)}"
            )
