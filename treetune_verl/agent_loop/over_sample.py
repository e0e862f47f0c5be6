# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling with abort: the step's completion target, its batch-wide counter, and each worker's share.

verl 0.7.1 documents ``actor_rollout_ref.rollout.over_sample_rate`` ("abort remaining requests when
``(1 - over_sample_rate) * total`` completions are reached", ``rollout.yaml:116-118``) but nothing reads it. Here:

- the manager checks the settings at start-up (``treetune_verl/trainer/features.py``: the rate, the estimator, the
  actor's loss fix) and computes :func:`completion_target` for a training batch and starts a step on one
  :class:`CompletionCounter` actor shared by all agent-loop workers (the target counts over the whole batch);
- each worker's :class:`OverSampleStep` claims a slot for every trajectory that finishes, and once the counter says
  the target is reached it aborts its still-running trajectories by their session prefix
  (:mod:`treetune_verl.rollout.session`);
- a trajectory is kept exactly when its claim succeeds, so a step always keeps ``target`` rows and marks
  ``batch - target`` aborted, even when a few trajectories finish while the abort is on its way (they lose the race
  and are dropped like the rest).

A trajectory's session and step travel with its coroutine in ``trajectory.CURRENT_TRAJECTORY``.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import ray

from treetune_verl.batch_keys import OVER_SAMPLE_META_KEY
from treetune_verl.timing import OVER_SAMPLING, SECONDS


def completion_target(rate: float, batch_size: int) -> int:
    """``ceil((1 - rate) * batch_size)``: how many rows of a step must complete before the rest are aborted.

    Computed on the rate's decimal value so that e.g. ``(1 - 0.1) * 10`` gives 9, not 10. At least 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    keep = round((1.0 - rate) * batch_size, 9)
    return max(1, min(batch_size, math.ceil(keep)))


class StepCounter:
    """Counts the completed trajectories of each running step across all agent-loop workers.

    ``claim`` hands out exactly ``target`` slots per step; ``wait`` returns once they are all taken. Runs as the Ray
    actor :data:`CompletionCounter`, which serialises the calls of all workers.
    """

    def __init__(self) -> None:
        self._steps: dict[str, _StepCount] = {}

    async def begin(self, step: str, target: int) -> None:
        self._steps[step] = _StepCount(target=target, reached=asyncio.Event())

    async def claim(self, step: str) -> bool:
        """One trajectory of ``step`` finished: ``True`` if it is within the target (keep it), else ``False``."""
        count = self._steps[step]
        if count.claimed >= count.target:
            return False
        count.claimed += 1
        if count.claimed == count.target:
            count.reached.set()
        return True

    async def wait(self, step: str) -> None:
        await self._steps[step].reached.wait()

    async def end(self, step: str) -> int:
        """Forget ``step``; returns how many slots were claimed."""
        return self._steps.pop(step).claimed

    async def open_steps(self) -> int:
        return len(self._steps)


@dataclass
class _StepCount:
    target: int
    reached: asyncio.Event
    claimed: int = 0


CompletionCounter = ray.remote(num_cpus=0)(StepCounter)


class OverSampleStep:
    """One worker's share of an over-sampled step: its open trajectories, the abort, and the claims.

    Args:
        counter: the :class:`CompletionCounter` handle from ``prompts.meta_info``.
        step: the step's key at the counter.
    """

    def __init__(self, counter: Any, step: str) -> None:
        self._counter, self._step = counter, step
        self._open: set[str] = set()
        self.aborted_sessions: list[str] = []  # sessions this worker aborted (to forget at the servers)
        self.target_reached = False

    def open(self, session: str) -> None:
        self._open.add(session)

    async def settle(self, session: str) -> bool:
        """The trajectory ``session`` stopped (finished or aborted): ``True`` to keep it, ``False`` if aborted."""
        self._open.discard(session)
        if self.target_reached:
            return False
        return await self._counter.claim.remote(self._step)

    async def abort_when_target_reached(self, server_manager: Any) -> None:
        """Wait for the batch-wide target, then abort every trajectory of this worker still open.

        From then on the server manager answers these trajectories' turns at once (``target_reached``), and the
        servers cut the requests already running.
        """
        await self._counter.wait.remote(self._step)
        with SECONDS.timed(OVER_SAMPLING):
            self.target_reached = True
            self.aborted_sessions = sorted(self._open)
            if self.aborted_sessions:
                await server_manager.abort_sessions(self.aborted_sessions)


def step_of(meta_info: dict[str, Any]) -> tuple[Any, str] | None:
    """``(counter, step key)`` when the manager asked for over-sampling in this batch, else ``None``."""
    plan = meta_info.get(OVER_SAMPLE_META_KEY)
    if plan is None or meta_info.get("validate", False):
        return None
    return plan["counter"], plan["step"]
