# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Tool calls in the model's text, parsed into OpenAI ``tool_calls`` (Hermes / Qwen ``<tool_call>`` JSON).

    'Let me add.\\n<tool_call>\\n{"name": "add", "arguments": {"a": 3, "b": 4}}\\n</tool_call>'
    -> content 'Let me add.', tool_calls [{"id": "call_...", "type": "function",
                                          "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]

Parsing only reads the text: the tokens the model produced for the call stay as they are in the sequence (trained
on); the tool's answer comes back as a ``role: tool`` message whose template tokens are masked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ParsedToolCalls:
    """``content``: the text outside the calls (``None`` when empty, as OpenAI returns it); ``tool_calls`` in
    OpenAI's dict shape; ``errors``: one message per ``<tool_call>`` block that was not valid JSON with a name."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse_hermes_tool_calls(text: str) -> ParsedToolCalls:
    """Every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block of ``text``.

    A malformed block is left in ``content`` and reported in ``errors`` (the model's text is not lost).
    """
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    position = 0
    for match in _HERMES.finditer(text):
        try:
            payload = json.loads(match.group(1))
            name = payload["name"]
            arguments = payload.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError(f"name is {type(name).__name__}")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
            errors.append(f"unparsable tool call {match.group(1)[:80]!r}: {error}")
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(
            {
                "id": f"call_{uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    kept.append(text[position:])
    content = "".join(kept).strip() if calls else text
    return ParsedToolCalls(content=content or None, tool_calls=calls, errors=errors)
