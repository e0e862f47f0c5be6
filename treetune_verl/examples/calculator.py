# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Arithmetic with a calculator tool: the example environment of README "Write an environment" (shown there in full).

The dataset is verl's arithmetic parquet of the e2e run (``treetune_tests/e2e/arithmetic_data.py``: a chat prompt and
``reward_model.ground_truth``). The model may call ``calculate`` (a, op, b) up to ``max_turns`` times; the reward is
1.0 for the right final number, else partial credit that shrinks with the distance (GRPO needs rewards that differ
within a group), with the extra ``solved``.
"""

import json
import operator
import re

from treetune_verl.managed import Environment

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
ARGS = {"a": {"type": "integer"}, "op": {"type": "string", "enum": list(OPS)}, "b": {"type": "integer"}}
CALCULATOR = {
    "type": "function",
    "function": {"name": "calculate", "parameters": {"type": "object", "properties": ARGS}},
}


def calculate(arguments: str) -> str:
    try:
        call = json.loads(arguments)
        return str(OPS[call["op"]](int(call["a"]), int(call["b"])))
    except (ValueError, KeyError, TypeError) as error:
        return f"error: {error!r}"


class Calculator(Environment):
    max_turns = 3

    def task(self, row):
        return list(row["raw_prompt"]), int(row["reward_model"]["ground_truth"])

    async def episode(self, client, task):
        messages = list(task[0])
        for _ in range(self.max_turns):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
            message = reply.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)}
                )
        return messages

    def score(self, task, messages):
        numbers = re.findall(r"-?\d+", getattr(messages[-1], "content", None) or "")
        error = abs(int(numbers[-1]) - task[1]) if numbers else None
        reward = 0.0 if error is None else 1.0 if error == 0 else 0.5 / (1 + error)
        return reward, {"solved": float(error == 0)}
