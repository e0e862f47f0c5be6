# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""A reward function for verl's reward workers (``reward.custom_reward_function``) that records each call."""

from __future__ import annotations

COUNTED_SCORE = 0.5


def counted_score(data_source, solution_str, ground_truth, extra_info=None, calls_file=None, **kwargs) -> float:
    """:data:`COUNTED_SCORE` for any response; appends a line to ``calls_file`` (``reward_kwargs``) per call."""
    with open(calls_file, "a") as calls:
        calls.write(f"{(extra_info or {}).get('index')}\n")
    return COUNTED_SCORE
