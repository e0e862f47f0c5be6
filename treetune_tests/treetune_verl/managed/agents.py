# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Agent functions of the managed-session tests, importable by path (``entropy_managed_agent``'s ``agent_fn``).

``openai_tool_agent`` is written against the ``openai.AsyncOpenAI`` call shape only: it would run unchanged against
an OpenAI endpoint (``client = openai.AsyncOpenAI(...)``).
"""

from __future__ import annotations

import json

from treetune_verl.managed import Environment, ManagedOpenAIClient, ScoredNode

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


def branch_score(index: int, branch: int) -> float:
    """The score ``branching_agent`` gives: distinct per sample and branch, so a row on the wrong slot shows."""
    return float(index) + 0.25 * branch


async def branching_agent(managed, messages, **sample):
    """Answer, get asked to check, check twice (``n=2``): two branches sharing the first turn and the follow-up,
    each scored by the agent (:func:`branch_score`) with the reward extra ``branch``."""
    messages = list(messages)
    reply = await managed.chat_completion(messages, max_tokens=24)
    messages += [reply.choices[0].message, {"role": "user", "content": "Check it."}]
    await managed.chat_completion(messages, n=2, max_tokens=24)
    index = int(sample["index"])
    return [
        ScoredNode(node, branch_score(index, branch), {"branch": float(branch)})
        for branch, node in enumerate(managed.last_nodes)
    ]


async def unscored_branching_agent(managed, messages, **sample):
    """``branching_agent``'s two branches without a score: verl's reward function scores them."""
    return [row.node for row in await branching_agent(managed, messages, **sample)]


async def nan_scoring_agent(managed, messages, **sample):
    reply = await managed.chat_completion(list(messages), max_tokens=8)
    del reply
    return ScoredNode(managed.last_node, float("nan"))


class AddingEnvironment(Environment):
    """``openai_tool_agent`` as an environment (the stand-in server calls ``add`` where the plan says ``tool``): up to
    ``max_turns`` turns, each tool call answered; reward 1.0 when the episode ends on a reply without a tool call, with the
    extra ``tool_results`` (how many the episode answered)."""

    max_turns = 2

    def task(self, row):
        return list(row["raw_prompt"])

    async def episode(self, client, task):
        messages = list(task)
        for _ in range(self.max_turns):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])}
                )
        return messages

    def score(self, task, messages):
        answered = sum(1 for message in messages if isinstance(message, dict) and message.get("role") == "tool")
        ended = not isinstance(messages[-1], dict) and not messages[-1].tool_calls
        return float(ended), {"tool_results": float(answered)}
