# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Chat messages as agent code passes them (dicts or OpenAI message objects): plain dicts, and a comparable key.

A new call extends a tracked conversation when its message list starts with that conversation. Messages are compared
by :func:`message_key` (role, content, tool calls by name and parsed arguments, tool_call_id), so an agent may pass
back the ``choice.message`` object it received, its ``model_dump()``, or a dict it wrote itself.
"""

from __future__ import annotations

import json
from typing import Any


def as_dict(message: Any) -> dict[str, Any]:
    """A message as a plain dict (``model_dump(exclude_none=True)`` for OpenAI / pydantic objects)."""
    if hasattr(message, "model_dump"):
        return message.model_dump(exclude_none=True)
    if isinstance(message, dict):
        return dict(message)
    raise TypeError(f"a chat message must be a dict or an OpenAI message object, got {type(message).__name__}")


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def message_key(message: dict[str, Any]) -> str:
    """What two messages must share to be the same turn (JSON text, so nested contents compare too)."""
    calls = [
        {"name": call["function"]["name"], "arguments": _arguments(call["function"].get("arguments"))}
        for call in message.get("tool_calls") or []
    ]
    key = {
        "role": message.get("role"),
        "content": message.get("content") or "",
        "tool_calls": calls,
        "tool_call_id": message.get("tool_call_id"),
    }
    return json.dumps(key, sort_keys=True, default=str)


def for_template(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: tool-call arguments as a dict (Qwen / Hermes templates ``tojson`` them)."""
    if not message.get("tool_calls"):
        return message
    calls = [
        {**call, "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments"))}}
        for call in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}
