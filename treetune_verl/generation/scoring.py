# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Rule-based answer check: is the response's final answer the ground truth?

``builtin``: the answer is the first number after the last ``####`` if there is one, else the last number in the
response (commas and a trailing ``.0`` tolerated); numeric ground truths compare as numbers, others as stripped
text. ``verl``: verl's own ``default_compute_score(data_source, response, ground_truth)``, the reward the trainer
would give (GSM8K, MATH, ... by ``data_source``). Scores are 1.0 / 0.0 (verl's may be partial).
"""

from __future__ import annotations

import re
from collections.abc import Callable

SCORERS = ("builtin", "verl", "none")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(response: str) -> str | None:
    """The answer a response gives (see module docstring), as text; ``None`` if it gives no number."""
    head, marker, tail = response.rpartition("####")
    if marker:
        numbers = _NUMBER.findall(tail)
        if numbers:
            return numbers[0].replace(",", "")
        return tail.strip() or None
    numbers = _NUMBER.findall(head or response)
    return numbers[-1].replace(",", "") if numbers else None


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def builtin_score(response: str, ground_truth: str) -> float:
    """1.0 if :func:`final_answer` equals ``ground_truth`` (numerically when both are numbers), else 0.0."""
    answer = final_answer(response)
    if answer is None:
        return 0.0
    expected, given = _as_number(ground_truth.strip()), _as_number(answer)
    if expected is not None and given is not None:
        return 1.0 if abs(expected - given) < 1e-9 else 0.0
    return 1.0 if answer.strip() == ground_truth.strip() else 0.0


def make_scorer(name: str) -> Callable[[str, str, str | None], float | None]:
    """``score(data_source, response, ground_truth)``; ``None`` when there is no ground truth or ``name == "none"``."""
    if name not in SCORERS:
        raise ValueError(f"score.function must be one of {list(SCORERS)}, got {name!r}")
    if name == "none":
        return lambda data_source, response, ground_truth: None
    if name == "builtin":
        return lambda data_source, response, ground_truth: (
            None if ground_truth is None else builtin_score(response, ground_truth)
        )
    from verl.utils.reward_score import default_compute_score

    def verl_score(data_source: str, response: str, ground_truth: str | None) -> float | None:
        if ground_truth is None:
            return None
        result = default_compute_score(data_source, response, ground_truth)
        return float(result["score"] if isinstance(result, dict) else result)

    return verl_score
