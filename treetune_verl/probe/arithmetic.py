# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Built-in task of the main job: "What is a+b? Answer with a number." with a checkable reward.

The assistant turn is pre-filled with "a + b =" (SmolLM2-135M-Instruct answers in that form anyway), so the response
starts with the answer and a handful of new tokens suffice: CPU time goes into the probe, not into long responses.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class ArithmeticItem:
    question: str  # the user turn
    prefill: str  # the start of the assistant turn, part of the prompt
    answer: int


def arithmetic_prompts(n: int, max_operand: int, rng: random.Random) -> list[ArithmeticItem]:
    """``n`` items with operands drawn uniformly from ``0 .. max_operand``."""
    items = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        items.append(ArithmeticItem(f"What is {a}+{b}? Answer with a number.", f"{a} + {b} =", a + b))
    return items


def arithmetic_reward(response: str, answer: int) -> float:
    """1.0 if the first integer in the response equals ``answer``, else 0.0.

    The response continues "a + b =", so its first integer is the model's answer; later numbers (rambling, a second
    equation) do not count, and a response without a number scores 0.
    """
    match = _INTEGER.search(response)
    return 1.0 if match is not None and int(match.group()) == answer else 0.0
