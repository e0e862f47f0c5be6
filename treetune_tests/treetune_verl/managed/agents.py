# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Agent functions of the managed-session tests, importable by path (``entropy_managed_agent``'s ``agent_fn``).

``openai_tool_agent`` is written against the ``openai.AsyncOpenAI`` call shape only: it would run unchanged against
an OpenAI endpoint (``client = openai.AsyncOpenAI(...)``).
"""

from __future__ import annotations

import json

from treetune_verl.managed import ManagedOpenAIClient

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


async def openai_tool_agent(managed, messages, **sample):
    client = ManagedOpenAIClient(managed)
    messages = list(messages)
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    message = reply.choices[0].message
    messages.append(message)
    for call in message.tool_calls or []:
        arguments = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])})
    if message.tool_calls:
        await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    return None  # train on the last call's node


async def two_turn_agent(managed, messages, **sample):
    """Answer, get asked to double-check, answer again (the e2e variant's agent; the follow-up's tokens masked)."""
    messages = list(messages)
    reply = await managed.chat_completion(messages, max_tokens=24)
    messages += [reply.choices[0].message, {"role": "user", "content": "Check it."}]
    await managed.chat_completion(messages, max_tokens=24)
    return None
