# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling with abort: the step's completion target in whole groups, its batch-wide counter, each worker's share.

verl 0.7.1 documents ``actor_rollout_ref.rollout.over_sample_rate`` ("abort remaining requests when
``(1 - over_sample_rate) * total`` completions are reached", ``rollout.yaml:116-118``) but nothing reads it. Here the
target counts *groups* (a prompt's ``rollout.n`` responses, one ``uid``): a step keeps the first
:func:`~treetune_verl.trainer.features.completion_target` groups whose every response has finished, and aborts the
rest, so every trained group is whole and a group estimator's statistics are verl's own. At ``rollout.n = 1`` a group
is one row.

- the manager checks the settings at start-up (``treetune_verl/trainer/features.py``), counts the batch's groups
  (:func:`group_sizes`), and starts a step with the target on one :class:`CompletionCounter` actor shared by all
  agent-loop workers (groups may be split across workers);
- each worker's :class:`OverSampleStep` settles every trajectory that stops: the counter answers once the
  trajectory's group is decided (kept: it completed within the target; dropped: the target was reached first), and
  once the target is reached the worker aborts its still-running trajectories by their session prefix
  (:mod:`treetune_verl.rollout.session`);
- a step therefore keeps exactly ``target`` whole groups and marks every other row aborted, including the finished
  rows of groups that did not complete in time, and a group that completes while the abort is on its way.

A trajectory's session, group and step travel with its coroutine in ``trajectory.CURRENT_TRAJECTORY``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from treetune_verl.batch_keys import OVER_SAMPLE_META_KEY
from treetune_verl.rollout.session import group_session_id
from treetune_verl.timing import OVER_SAMPLING, SECONDS


def group_sizes(uids: Sequence[Any] | None, needs: str = "over-sampling keeps whole groups") -> dict[str, int]:
    """Rows per group of a batch: its ``uid`` column (``non_tensor_batch["uid"]``, which verl's trainer sets, one per
    prompt, shared by its ``rollout.n`` responses), counted. ``needs`` says, in the error, what needs the groups.

    Raises:
        ValueError: the batch has no ``uid`` column (nothing says which rows form a group).
    """
    if uids is None:
        raise ValueError(
            f'{needs}, named by non_tensor_batch["uid"] (verl\'s trainer sets it for every training batch); this '
            "batch has no uid column"
        )
    return dict(Counter(str(uid) for uid in uids))


class StepCounter:
    """Decides the groups of each running step across all agent-loop workers.

    ``settle`` is called once per row when its trajectory stops and answers when the row's group is decided:
    ``True`` if the group completed while fewer than ``target`` groups had, ``False`` once the target is reached
    without it. ``wait`` returns once the target is reached. Runs as the Ray actor :data:`CompletionCounter`, which
    serialises the calls of all workers.
    """

    def __init__(self) -> None:
        self._steps: dict[str, _StepCount] = {}

    async def begin(self, step: str, target: int, sizes: dict[str, int]) -> None:
        if not 1 <= target <= len(sizes):
            raise ValueError(f"step {step}: target {target} groups of {len(sizes)}")
        self._steps[step] = _StepCount(target=target, sizes=sizes, reached=asyncio.Event())

    async def settle(self, step: str, group: str, failed: bool = False) -> bool:
        """One row of ``group`` stopped: ``True`` to keep it (its group is one of the step's kept groups).

        ``failed``: the row's agent loop raised (failed rows aborted): its group can no longer complete and is
        dropped, its waiting rows with it.
        """
        count = self._steps[step]
        if count.reached.is_set():
            return False  # every kept group was complete before this row stopped
        if group not in count.sizes:
            raise KeyError(f"step {step}: group {group!r} is not in the batch")
        if failed or group in count.failed:
            count.failed.add(group)
            count.completed(group).set()  # decided: its waiting rows wake to a group that is not kept
            return False
        count.finished[group] = count.finished.get(group, 0) + 1
        if count.finished[group] == count.sizes[group]:
            count.kept.add(group)
            count.completed(group).set()
            if len(count.kept) == count.target:
                count.reached.set()
                for other in count.sizes:  # every group still undecided is dropped: wake its waiting rows
                    count.completed(other).set()
            return True
        await count.completed(group).wait()
        return group in count.kept

    async def wait(self, step: str) -> bool:
        """Returns once ``step``'s target is reached (``True``) or the step ended without it (``False``: failures
        left fewer whole groups than the target)."""
        count = self._steps[step]
        await count.reached.wait()
        return len(count.kept) == count.target

    async def kept_groups(self, step: str) -> list[str]:
        """The groups ``step`` keeps (final once its target is reached)."""
        return sorted(self._steps[step].kept)

    async def end(self, step: str) -> int:
        """Forget ``step`` and wake its waiters (no call is left parked here); returns how many groups were kept."""
        count = self._steps.pop(step)
        count.reached.set()
        return len(count.kept)

    async def open_steps(self) -> int:
        return len(self._steps)


@dataclass
class _StepCount:
    target: int
    sizes: dict[str, int]
    reached: asyncio.Event
    finished: dict[str, int] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    _completed: dict[str, asyncio.Event] = field(default_factory=dict)

    def completed(self, group: str) -> asyncio.Event:
        """Set when ``group`` is decided: every row stopped within the target (kept), one failed, or the target was
        reached without it (dropped)."""
        return self._completed.setdefault(group, asyncio.Event())


# Every row of a step may be waiting in ``settle`` at once: an async actor runs at most ``max_concurrency`` calls,
# and a call beyond it would queue behind the waiting ones (the row that completes their group among them).
MAX_WAITING_ROWS = 1 << 20
CompletionCounter = ray.remote(num_cpus=0, max_concurrency=MAX_WAITING_ROWS)(StepCounter)


class OverSampleStep:
    """One worker's share of an over-sampled step: its open trajectories, the abort, and the settling.

    Args:
        counter: the :class:`CompletionCounter` handle from ``prompts.meta_info``.
        step: the step's key at the counter.
        abort_failed_rows: rows whose agent loop raises become aborted rows (their group dropped).
        global_step: the trainer's ``global_steps`` of the batch (the weights its tokens are sampled with).
        carry_over: aborted rows are recorded to be resumed at the next step (``carry_over.py``).
    """

    def __init__(
        self,
        counter: Any,
        step: str,
        abort_failed_rows: bool = False,
        global_step: int = 0,
        carry_over: bool = False,
    ) -> None:
        self._counter, self._step = counter, step
        self.abort_failed_rows = abort_failed_rows  # a loop that raises becomes an aborted row (else: the step fails)
        self.global_step, self.carry_over = global_step, carry_over
        self._open: set[str] = set()
        self.aborted_sessions: list[str] = []  # sessions this worker aborted (to forget at the servers)
        self.failed_sessions: set[str] = set()  # sessions whose agent loop raised
        self.eval_groups: set[str] = set()  # groups whose forecast E runs under their group session (eval_session)
        self.target_reached = False

    def open(self, session: str) -> None:
        self._open.add(session)

    async def settle(self, session: str, group: str, failed: bool = False) -> bool:
        """The trajectory ``session`` of ``group`` stopped (finished, aborted, or ``failed``: its loop raised):
        ``True`` to keep it.

        Waits until its group is decided (a finished row of a group still running waits for the group's last row, or
        for the target).
        """
        self._open.discard(session)
        if self.target_reached:
            return False
        return await self._counter.settle.remote(self._step, group, failed)

    def eval_session(self, group: str) -> str | None:
        """The session to name the forecast's E of ``group`` after (``session.eval_request_id``), aborted with the
        group's trajectories if the group is dropped; ``None`` once the target is reached: a group whose first turn
        comes after it cannot be kept, and its E would only hold the step."""
        if self.target_reached:
            return None
        self.eval_groups.add(group)
        return group_session_id(group)

    def is_open(self, session: str) -> bool:
        """Whether ``session`` has not been settled yet."""
        return session in self._open

    async def abort_when_target_reached(self, server_manager: Any) -> None:
        """Wait for the batch-wide target, then abort every trajectory of this worker still open, and the forecast's E
        of every group it does not keep.

        From then on the server manager answers these trajectories' turns at once (``target_reached``), and the
        servers cut the requests already running.
        """
        if not await self._counter.wait.remote(self._step):
            return  # the step ended without reaching its target: nothing is left to abort
        kept = set(await self._counter.kept_groups.remote(self._step)) if self.eval_groups else set()
        with SECONDS.timed(OVER_SAMPLING):
            self.target_reached = True
            dropped_evals = [group_session_id(group) for group in sorted(self.eval_groups - kept)]
            self.aborted_sessions = sorted(self._open) + dropped_evals
        if self.aborted_sessions:  # awaited outside the block: waiting is not our work (timing.py)
            await server_manager.abort_sessions(self.aborted_sessions)


def plan_of(meta_info: dict[str, Any]) -> dict[str, Any] | None:
    """The manager's plan for this batch (``counter``, ``step``, ``target``, ``abort_failed_rows``, ``carry_over``,
    ``global_step``) when its rows run through the counter (over-sampling or failed rows aborted; never in
    validation), else ``None``."""
    plan = meta_info.get(OVER_SAMPLE_META_KEY)
    if plan is None or meta_info.get("validate", False):
        return None
    return plan
