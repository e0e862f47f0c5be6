# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Managed sessions that train several rows: verl 0.7.1's ``AgentLoopWorker`` taking k rows from one session.

verl 0.7.1's trainer repeats each prompt ``rollout.n`` times (one uid, consecutive rows) and unions the rollout
output with that batch row for row, so a prompt gets exactly ``n`` rows. With
``rollout.custom.managed.rows_per_session = k`` a managed session returns k rows (its branches, each with its own
reward), so a prompt's ``n`` rows are ``n / k`` sessions: of the k consecutive rows of a block, the first runs the
session and the others take its 2nd..k-th rows. All ``n`` rows keep the prompt's uid: one GRPO group of ``n``, the
size verl's ``rollout.n`` says. ``n`` must be a multiple of k (refused at the loop's start), and so must every uid's
count of rows in a worker's chunk (refused before any request, naming the uid: verl splits the batch evenly across
``agent.num_workers``).

Validation (``rollout.val_kwargs.n`` rows, often 1) runs one session per row and keeps its first row.

Outermost of the worker's features (``worker.py``): the other features see each of a session's rows as a row of
its own. Also checked here, since verl would fail deep in ``_postprocess``: every row carries the same reward-extra
names (verl takes them from the first row).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    _InternalAgentLoopOutput,
)
from verl.protocol import DataProto

from treetune_verl.agent_loop.loop_registry import is_managed
from treetune_verl.agent_loop.over_sample import group_sizes
from treetune_verl.rollout.rollout_config import ROWS_PER_SESSION_KEY, rows_per_session

REWARD_EXTRA_INFO = "reward_extra_info"  # verl's AgentLoopOutput.extra_fields key (agent_loop.py _postprocess)


class SessionRowsWorker(AgentLoopWorker):
    """Gives each block of k rows of a uid the k rows of one managed session (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rows_per_session = rows_per_session(self.rollout_config)
        self._arrivals: Counter[str] = Counter()  # rows of each uid that started, this batch
        self._sessions: dict[tuple[str, int], asyncio.Future] = {}  # (uid, block) -> the session's k rows

    async def generate_sequences(self, batch: DataProto) -> DataProto:
        k = self._rows_per_session
        if k > 1 and not batch.meta_info.get("validate", False):
            _check_blocks(batch, k)
        try:
            return await super().generate_sequences(batch)
        finally:
            self._arrivals.clear()
            self._sessions.clear()

    async def _run_agent_loop(
        self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *, agent_name: str, **kwargs: Any
    ) -> _InternalAgentLoopOutput:
        k = self._rows_per_session
        if not is_managed(agent_name):
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, **kwargs)
        where = f"agent loop {agent_name!r}, uid {kwargs.get('uid')!r}, index {kwargs.get('index')!r}"
        if trajectory.get("validate") or k == 1:
            rows = await self._session_rows(sampling_params, trajectory, agent_name, kwargs)
            if len(rows) != 1 and not trajectory.get("validate"):
                raise ValueError(f"{where}: the agent returned {len(rows)} rows; {ROWS_PER_SESSION_KEY}=1")
            return rows[0]
        # Claimed before the first await: rows start in batch order, so a block's first row is its first to start.
        uid = str(kwargs["uid"])
        block, slot = divmod(self._arrivals[uid], k)
        self._arrivals[uid] += 1
        session = self._sessions.setdefault((uid, block), asyncio.get_running_loop().create_future())
        if slot > 0:
            return (await session)[slot]
        try:
            rows = await self._session_rows(sampling_params, trajectory, agent_name, kwargs)
            if len(rows) != k:
                raise ValueError(f"{where}: the agent returned {len(rows)} rows; {ROWS_PER_SESSION_KEY}={k}")
        except BaseException as error:
            session.set_exception(error)
            raise
        session.set_result(rows)
        return rows[0]

    async def _session_rows(
        self, sampling_params: dict[str, Any], trajectory: dict[str, Any], agent_name: str, kwargs: dict[str, Any]
    ) -> list[_InternalAgentLoopOutput]:
        rows = await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, **kwargs)
        return rows if isinstance(rows, list) else [rows]

    async def _agent_loop_postprocess(
        self, output: AgentLoopOutput | list[AgentLoopOutput], **kwargs: Any
    ) -> _InternalAgentLoopOutput | list[_InternalAgentLoopOutput]:
        if not isinstance(output, list):
            return await super()._agent_loop_postprocess(output, **kwargs)
        rows = []  # one at a time through the other features: each row's reward, entropy and masks are its own
        for row in output:
            rows.append(await super()._agent_loop_postprocess(row, **kwargs))
        return rows

    def _postprocess(
        self, inputs: list[_InternalAgentLoopOutput], input_non_tensor_batch: dict | None = None
    ) -> DataProto:
        names = [sorted(item.extra_fields.get(REWARD_EXTRA_INFO) or {}) for item in inputs]
        for i, row_names in enumerate(names):
            if row_names != names[0]:
                raise ValueError(
                    f"row {i} carries reward extras {row_names}, row 0 carries {names[0]}: verl takes the names from "
                    "the first row, so every row (agent-scored or scored by verl's reward function) needs the same"
                )
        return super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch)


def _check_blocks(batch: DataProto, k: int) -> None:
    """Every uid of this chunk has a multiple of k rows; raises naming the first that does not."""
    needs = f"{ROWS_PER_SESSION_KEY}={k} puts a session's rows in one group"
    for uid, count in group_sizes(batch.non_tensor_batch.get("uid"), needs).items():
        if count % k:
            raise ValueError(
                f"uid {uid!r} has {count} rows in this agent-loop worker's chunk, not a multiple of "
                f"{ROWS_PER_SESSION_KEY}={k}: make train_batch_size * rollout.n / agent.num_workers (the rows "
                "verl hands each worker) a multiple of it"
            )
