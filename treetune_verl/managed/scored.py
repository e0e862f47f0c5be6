# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What an agent function hands back to train on: nodes, each with the agent's own reward when it has one.

An agent function (``entropy_managed_agent``) returns ``None`` (the first choice of its last call), a
:class:`~treetune_verl.managed.node.SequenceNode`, a :class:`ScoredNode`, or a list of nodes / scored nodes (the
branches of a session: one training row each). :func:`scored_rows` brings all of them to ``list[ScoredNode]``.

A score is the trajectory's reward, one float; ``None`` leaves the row to verl's reward function, as before.
``extras`` are named floats logged beside it (verl's ``reward_extra_info``): every row of a batch must carry the
same names, as verl takes them from its first row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from treetune_verl.managed.node import SequenceNode


@dataclass(frozen=True)
class ScoredNode:
    """One training row: ``node`` with the agent's reward ``score`` (``None``: verl's reward function scores it)."""

    node: SequenceNode
    score: float | None = None
    extras: Mapping[str, float] = field(default_factory=dict)


def scored_rows(returned: Any, last_node: SequenceNode | None, where: str) -> list[ScoredNode]:
    """The agent function's return value as rows; ``where`` names the sample in errors.

    Raises:
        RuntimeError: ``None`` returned and the session made no call (nothing to train on).
        TypeError: anything but the shapes in the module docstring.
        ValueError: an empty list, or a score / extra that is not a finite number.
    """
    if returned is None:
        if last_node is None:
            raise RuntimeError(f"{where}: the agent made no call, there is nothing to train on")
        returned = last_node
    items = list(returned) if isinstance(returned, (list, tuple)) else [returned]
    if not items:
        raise ValueError(f"{where}: the agent returned an empty list of nodes")
    rows = []
    for i, item in enumerate(items):
        row = ScoredNode(item) if isinstance(item, SequenceNode) else item
        if not isinstance(row, ScoredNode):
            raise TypeError(f"{where}, row {i}: expected a SequenceNode or ScoredNode, got {type(item).__name__}")
        _check_finite(row.score, f"{where}, row {i}: score", allow_none=True)
        for name, value in row.extras.items():
            _check_finite(value, f"{where}, row {i}: reward extra {name!r}")
        rows.append(row)
    return rows


def _check_finite(value: Any, what: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
