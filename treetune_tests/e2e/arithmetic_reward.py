# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Rule-based reward for the e2e arithmetic prompts, loaded by verl from this file's path
(``reward.custom_reward_function.path=<this file>``, ``.name=compute_score``). Standard library only.

GRPO normalises rewards within each prompt's group; a reward that is equal for every sample of a group (e.g. 0 for
all, as a strict exact-match reward gives a small or random model) makes every advantage 0 and the update a no-op.
So besides full credit for the right answer there is graded partial credit that differs between almost any two
responses:

- 1.0 if the answer (the number after ``####``, else the last number in the response) equals the ground truth;
- otherwise ``0.5 / (1 + |answer - truth|)`` if there is a number at all, plus 0.1 for using the ``####`` format,
  plus ``0.2 * (fraction of characters that are digits)``.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+")


def extract_answer(text: str) -> tuple[int | None, bool]:
    """The answer the response gives and whether it used the ``####`` format."""
    marked = text.rsplit("####", 1)
    if len(marked) == 2:
        numbers = _NUMBER.findall(marked[1])
        if numbers:
            return int(numbers[0]), True
    numbers = _NUMBER.findall(text)
    return (int(numbers[-1]) if numbers else None), False


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    truth = int(str(ground_truth).strip())
    answer, formatted = extract_answer(solution_str)
    if answer == truth:
        return 1.0
    digits = sum(ch.isdigit() for ch in solution_str) / max(len(solution_str), 1)
    closeness = 0.5 / (1 + abs(answer - truth)) if answer is not None else 0.0
    return closeness + (0.1 if formatted else 0.0) + 0.2 * digits
