# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The built-in prompt set: generated arithmetic word problems with integer answers.

Deterministic for a given ``(count, seed)``: prompt ``i`` is the same in every run, so a resumed run asks the same
questions. Five templates (add, take away, multiply, share equally, add then take away) with small operands: a
135M-parameter model gets some right, so correct and wrong answers can both be studied.

Not ``treetune_verl.probe.arithmetic``: the probe stands alone (nothing imports it), and its "What is a+b?" with the
answer pre-filled yields one- or two-token responses, too short to see entropy move along a response.
"""

from __future__ import annotations

import random

from treetune_verl.generation.inputs import PromptItem

DATA_SOURCE = "treetune/word_problems"
INSTRUCTION = "Think step by step, then give the final answer as a number after '####'."

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jaya", "Kofi", "Lena")
_THINGS = ("apples", "pencils", "marbles", "stickers", "books", "cookies", "shells", "coins")


def _problem(rng: random.Random) -> tuple[str, int]:
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
    if kind == 1:
        a = rng.randint(10, 90)
        b = rng.randint(1, a - 1)
        return f"{name} has {a} {thing} and gives {b} of them away. How many {thing} are left?", a - b
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"A bag holds {a} {thing}. How many {thing} are in {b} bags?", a * b
    if kind == 3:
        each, friends = rng.randint(2, 12), rng.randint(2, 9)
        return (
            f"{name} shares {each * friends} {thing} equally among {friends} friends. "
            f"How many {thing} does each friend get?",
            each,
        )
    a, b = rng.randint(5, 50), rng.randint(2, 30)
    c = rng.randint(1, a + b - 1)
    return f"{name} has {a} {thing}, buys {b} more and then loses {c}. How many {thing} does {name} have?", a + b - c


def word_problem_items(count: int, seed: int = 0) -> list[PromptItem]:
    """``count`` problems as chat prompts (one user message), ``ground_truth`` the integer answer as a string."""
    rng = random.Random(seed)
    items = []
    for index in range(count):
        question, answer = _problem(rng)
        items.append(
            PromptItem(
                prompt_id=f"wp-{index:05d}",
                messages=({"role": "user", "content": f"{question} {INSTRUCTION}"},),
                data_source=DATA_SOURCE,
                ground_truth=str(answer),
            )
        )
    return items
