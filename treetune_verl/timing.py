# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What each feature of ours costs a training step: one definition, the same on both stacks.

Two figures per feature and step, never summed into one:

- **critical** (``timing_s/treetune/<feature>``): wall seconds the step waits on our code. Only the trainer's process
  counts them (the process that runs verl's ``fit``, where a step's thread does nothing else while our code runs): the
  wall time of our synchronous blocks there, plus intervals a feature measures on the step's path itself
  (:meth:`FeatureSeconds.waited`: over-sampling's "target reached → the step goes on"). Our blocks in other processes
  (the agent-loop workers) overlap generation and are not counted here.
- **work** (``cpu_s/treetune/<feature>``): CPU seconds of our synchronous code in any process, summed over processes
  (CPU time adds up; waiting does not): the thread CPU time (``time.thread_time``) of each block. The workers send
  theirs to the trainer with the rows of each batch (``batch_keys.TIMING_KEY``, verl 0.7.1).

Each process keeps one :data:`SECONDS`; code of a feature runs inside ``SECONDS.timed(feature)``. **A timed block
must not await**: while it awaits, other tasks of the thread run, and both its thread CPU time and its wall time would
count their work as ours (the old definition summed concurrent rows' waiting this way, more than the step's length). A
block entered while another is open in a different task of the same thread raises :class:`AwaitInTimedBlock`, so a
test running concurrent rows catches an ``await`` inside a block. Awaited waits on the step's path are measured by
their caller and given to :meth:`FeatureSeconds.waited`. Nested blocks count exclusively: an inner block's seconds
are its feature's and not the outer one's, so the total is never counted twice.

The trainer's ``compute_timing_metrics`` seam logs every step :func:`step_metrics`: both figures per feature, their
totals and the critical total's share of verl's ``timing_s/step`` (``treetune/share_of_step``). Not here: the entropy
op inside sglang's sampler (``bench_entropy_throughput.py``), the servers' own work (another process), the forecast
(``timing_s/probe``). A shared leaf: imports nothing of the package.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

METRIC_PREFIX = "timing_s/treetune/"  # critical: wall seconds the step waits on our code
CPU_METRIC_PREFIX = "cpu_s/treetune/"  # work: our CPU seconds, all processes
SHARE_METRIC = "treetune/share_of_step"
# Features, in the order the metrics list them.
ROLLOUT_ENTROPY = "rollout_entropy"  # the worker's padding and marks, the manager's metrics
OVER_SAMPLING = "over_sampling"  # the step's target, aborts and the wait for them, empty rows, carry-over's records
STEERING = "steering"  # the advantages reshaped from rollout entropy
TRAINER_HOOKS = "trainer_hooks"  # the agreement with the actor, validation metrics, the step's pending metrics
FEATURES = (ROLLOUT_ENTROPY, OVER_SAMPLING, STEERING, TRAINER_HOOKS)


class AwaitInTimedBlock(RuntimeError):
    """A timed block was entered while another was open in a different task of the same thread: the open one awaited
    (its seconds would count the other task's)."""


@dataclass
class StepCost:
    """Seconds per feature since the last :meth:`FeatureSeconds.take`.

    ``wall``: this process's synchronous blocks (critical in the trainer's process only); ``waited``: intervals on
    the step's path measured by a feature; ``cpu``: CPU seconds, this process's and those added from others.
    """

    wall: dict[str, float] = field(default_factory=dict)
    waited: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def critical(self) -> dict[str, float]:
        """Wall seconds the step waited on each feature (this process being the trainer's)."""
        return _summed(self.wall, self.waited)


@dataclass
class _OpenBlock:
    feature: str
    task: object  # the asyncio task that entered it, or None outside an event loop
    wall_start: float
    cpu_start: float
    inner_wall: float = 0.0  # seconds of blocks nested in it (theirs, not its)
    inner_cpu: float = 0.0


class FeatureSeconds:
    """A process's seconds per feature since the last :meth:`take` (module docstring)."""

    def __init__(self) -> None:
        self._cost = StepCost()
        self._lock = threading.Lock()  # threads of one process (a Ray actor's pool) add to the same figures
        self._open = threading.local()  # per thread: the stack of open blocks

    @contextlib.contextmanager
    def timed(self, feature: str) -> Iterator[None]:
        """Count the enclosed synchronous code as ``feature``'s (it must not await: module docstring).

        Raises:
            AwaitInTimedBlock: a block of another task of this thread is open (it awaited).
        """
        _check_feature(feature)
        stack: list[_OpenBlock] = self._open.__dict__.setdefault("stack", [])
        task = _current_task()
        if stack and stack[-1].task is not task:
            raise AwaitInTimedBlock(
                f"a timed block of {feature!r} was entered while one of {stack[-1].feature!r} is open in another "
                "task: that block awaited, so its seconds would count other tasks' (treetune_verl/timing.py: a timed "
                "block must not await; measure an awaited wait with SECONDS.waited)"
            )
        block = _OpenBlock(feature, task, time.perf_counter(), time.thread_time())
        stack.append(block)
        try:
            yield
        finally:
            wall = time.perf_counter() - block.wall_start
            cpu = time.thread_time() - block.cpu_start
            stack.pop()
            if stack:
                stack[-1].inner_wall += wall
                stack[-1].inner_cpu += cpu
            with self._lock:
                _add(self._cost.wall, feature, wall - block.inner_wall)
                _add(self._cost.cpu, feature, cpu - block.inner_cpu)

    def waited(self, feature: str, seconds: float) -> None:
        """``seconds`` of wall time the step waited on ``feature``, measured by its caller (an awaited call, an
        interval from one event to another on the step's path)."""
        _check_feature(feature)
        if seconds < 0:
            raise ValueError(f"{feature}: waited {seconds} s; a wait is not negative")
        with self._lock:
            _add(self._cost.waited, feature, seconds)

    def add_cpu(self, seconds: Mapping[str, float]) -> None:
        """CPU seconds per feature of another process (an agent-loop worker's batch)."""
        with self._lock:
            for feature, value in seconds.items():
                _check_feature(feature)
                _add(self._cost.cpu, feature, value)

    def take(self) -> StepCost:
        """The seconds so far, and start again from zero."""
        with self._lock:
            cost, self._cost = self._cost, StepCost()
        return cost


SECONDS = FeatureSeconds()  # this process's


def step_metrics(cost: StepCost, step_s: float | None) -> dict[str, float]:
    """The trainer process's step: ``timing_s/treetune/<feature>`` (critical) and ``cpu_s/treetune/<feature>``
    (work) for every feature (0.0 when it did not run), each with its ``total``; given verl's ``step`` seconds,
    ``treetune/share_of_step`` (the critical total's share)."""
    critical = cost.critical()
    metrics: dict[str, float] = {}
    for prefix, seconds in ((METRIC_PREFIX, critical), (CPU_METRIC_PREFIX, cost.cpu)):
        values = {prefix + feature: float(seconds.get(feature, 0.0)) for feature in FEATURES}
        metrics.update(values)
        metrics[prefix + "total"] = sum(values.values())
    if step_s:
        metrics[SHARE_METRIC] = metrics[METRIC_PREFIX + "total"] / step_s
    return metrics


def _check_feature(feature: str) -> None:
    if feature not in FEATURES:
        raise ValueError(f"timing: unknown feature {feature!r}; the features are {', '.join(FEATURES)}")


def _current_task() -> object:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop running in this thread
        return None


def _add(seconds: dict[str, float], feature: str, value: float) -> None:
    seconds[feature] = seconds.get(feature, 0.0) + float(value)


def _summed(*parts: Mapping[str, float]) -> dict[str, float]:
    total: dict[str, float] = {}
    for part in parts:
        for feature, value in part.items():
            _add(total, feature, value)
    return total
