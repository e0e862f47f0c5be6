# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The trajectory an agent-loop coroutine works for, carried with it: its session and, when over-sampling, its group
and step.

The worker (``over_sample_worker.py``) sets :data:`CURRENT_TRAJECTORY` around each trajectory (a ``ContextVar``:
every agent-loop task gets its own copy); whoever sends the trajectory's requests reads it: the session server
manager (``session_server_manager.py``) names each turn after the session and answers an aborted step at once, and
managed sessions' ``VerlBackend`` (``treetune_verl/managed/backends.py``) does the same for the agent's calls.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from treetune_verl.agent_loop.over_sample import OverSampleStep


@dataclass(frozen=True)
class Trajectory:
    """Its session prefix (``rollout/session.py``) and, when over-sampling, its group (the row's ``uid``) and the
    worker's step."""

    session: str
    step: OverSampleStep | None = None
    group: str | None = None


CURRENT_TRAJECTORY: ContextVar[Trajectory | None] = ContextVar("treetune_trajectory", default=None)

# Set by a worker feature around one row's agent loop (the row's task and the tasks it starts see it), None elsewhere;
# whoever sends a turn of the row calls it with the turn's prompt ids first (verl 0.7.1: session_server_manager.py,
# verl 0.9.1: verl/v0_9_1/over_sample_worker.py SessionLLMServerClient). The live forecast starts E's requests at the first.
PROMPT_HOOK: ContextVar[Callable[[list[int]], None] | None] = ContextVar("treetune_prompt_hook", default=None)
