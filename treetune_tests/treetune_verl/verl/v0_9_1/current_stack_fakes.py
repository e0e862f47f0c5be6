# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1 pieces of the standalone test: a tool parser that calls ``add`` after every model turn (a random model
never writes a tool call), registered in the agent-loop worker's process by importing the loop class below."""

from __future__ import annotations

import json

from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser

from treetune_verl.verl.v0_9_1.entropy_tool_agent_loop import EntropyToolAgentLoop

ALWAYS_ADD = "treetune_always_add"  # multi_turn.format


@ToolParser.register(ALWAYS_ADD)
class AlwaysAddToolParser(ToolParser):
    """Every model turn asks for ``add(2, 3)``: the loop goes model / tool / model / ... up to its turn limit."""

    async def extract_tool_calls(self, responses_ids, tools=None):
        return self.tokenizer.decode(responses_ids), [FunctionCall(name="add", arguments=json.dumps({"a": 2, "b": 3}))]


class ToolCallingEntropyToolAgentLoop(EntropyToolAgentLoop):
    """``entropy_tool_agent`` itself: verl imports this class by its path in the worker, which registers the parser."""


TOOL_CALLING_LOOP = {"name": "entropy_tool_agent_calls", "_target_": f"{__name__}.ToolCallingEntropyToolAgentLoop"}
