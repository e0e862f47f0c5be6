# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""A tool the agent-loop tests configure (``multi_turn.tool_config_path``), importable on both stacks (verl 0.9.1 has
no ``verl.interactions``, which ``fakes.py`` needs)."""

from __future__ import annotations

from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class AddTool(BaseTool):
    """``add(a, b, pad=0)`` -> ``"sum=<a+b>"`` followed by ``pad`` characters (to overflow the response)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        total = int(parameters["a"]) + int(parameters["b"])
        return ToolResponse(text=f"sum={total}" + "x" * int(parameters.get("pad", 0))), 0.5, {}


TOOL_CONFIG = {
    "tools": [
        {
            "class_name": f"{__name__}.AddTool",
            "config": {"type": "native"},
            "tool_schema": {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two integers.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "a": {"type": "integer", "description": "first"},
                            "b": {"type": "integer", "description": "second"},
                            "pad": {"type": "integer", "description": "extra characters"},
                        },
                        "required": ["a", "b"],
                    },
                },
            },
        }
    ]
}
