# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The live forecast's E, sampled by the agent-loop worker while the batch's rollout runs (``forecast/rollout_eval.py``).

The manager marks the first row of each of E's uids with E's plan (``batch_keys.FORECAST_EVAL_PLAN_KEY``: G and the
sampling parameters). When that row's agent loop sends its first turn (``trajectory.PROMPT_HOOK``: the
prompt ids as the loop rendered them), this worker starts G requests for that prompt in a task of their own, and the
row goes on as without them: E decodes in the same server batches as the step's rows, from the start. A row that
sends no turn, or a carried row (whose first turn resumes a response), starts E from the prompt ids it returns. Once
every row has returned, the worker waits for its E tasks and hands each uid's E back on that uid's first row
(``batch_keys.FORECAST_EVAL_KEY``; the manager pops both columns), and on its first row when its rows had settled
(``batch_keys.ROWS_SETTLED_AT_KEY``: the step's wait after that is for E, the forecast's, not over-sampling's).

The tasks run in a fresh ``contextvars.Context``: E's requests are not turns of the row's session. When
over-sampling, they are named after the group's session
(``OverSampleStep.eval_session``), which the step aborts at its target when it drops the group: a dropped group's E
ends with its rows and is left out (``EvalCut``) instead of decoding on while the whole batch waits for it (issue
49), and a group whose first turn comes after the target gets no E. E of a kept group is whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker, _InternalAgentLoopOutput
from verl.protocol import DataProto

from treetune_verl.agent_loop.trajectory import CURRENT_TRAJECTORY, PROMPT_HOOK
from treetune_verl.batch_keys import CARRIED_ROW_KEY, FORECAST_EVAL_KEY, FORECAST_EVAL_PLAN_KEY, ROWS_SETTLED_AT_KEY
from treetune_verl.forecast.rollout_eval import EvalCut, EvalPlan, start_sampling

logger = logging.getLogger(__name__)


class ForecastEvalWorker(AgentLoopWorker):
    """Samples E for the rows the manager marked, beside the batch (module docstring)."""

    async def generate_sequences(self, batch: DataProto) -> DataProto:
        self._eval_tasks: dict[str, asyncio.Task] = {}  # uid -> its E, this batch
        try:
            output = await super().generate_sequences(batch)
            settled_at = time.time()  # every row settled; from here on the batch waits for E alone
            sampled = {}
            for uid, task in self._eval_tasks.items():
                try:
                    sampled[uid] = await task
                except EvalCut:
                    logger.info("entropy forecast: E of uid %s was cut with its dropped group; left out", uid)
        finally:
            for task in self._eval_tasks.values():
                task.cancel()  # only those still running: an error elsewhere leaves no request behind
            self._eval_tasks = {}
        settled = np.full(len(output), None, dtype=object)
        settled[:1] = settled_at
        output.non_tensor_batch[ROWS_SETTLED_AT_KEY] = settled
        if FORECAST_EVAL_PLAN_KEY in batch.non_tensor_batch:  # output rows are the input's, in order
            column = [sampled.pop(str(uid), None) for uid in batch.non_tensor_batch["uid"]]  # on each uid's first row
            output.non_tensor_batch[FORECAST_EVAL_KEY] = np.array(column, dtype=object)
        return output

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any):
        plan: EvalPlan | None = kwargs.get(FORECAST_EVAL_PLAN_KEY)
        if plan is None or kwargs.get(CARRIED_ROW_KEY) is not None:  # a carried row's first turn resumes a response
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        uid = str(kwargs.get("uid"))
        token = PROMPT_HOOK.set(lambda prompt_ids: self._start_eval(uid, prompt_ids, plan))
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        finally:
            PROMPT_HOOK.reset(token)

    async def _agent_loop_postprocess(self, output: AgentLoopOutput, **kwargs: Any) -> _InternalAgentLoopOutput:
        plan: EvalPlan | None = kwargs.get(FORECAST_EVAL_PLAN_KEY)
        if plan is not None:  # a row that sent no turn (or a carried row): E from the prompt it returns
            self._start_eval(str(kwargs.get("uid")), list(output.prompt_ids), plan)
        return await super()._agent_loop_postprocess(output, **kwargs)

    def _start_eval(self, uid: str, prompt_ids: list[int], plan: EvalPlan) -> None:
        """Start E of ``uid`` (called in the row's context: its trajectory says whether the step over-samples)."""
        trajectory = CURRENT_TRAJECTORY.get()
        abort_with = None
        if trajectory is not None and trajectory.step is not None:
            abort_with = trajectory.step.eval_session(uid)
            if abort_with is None:  # the target is reached: this group is dropped
                return
        start_sampling(self._eval_tasks, uid, prompt_ids, plan, self.server_manager, abort_with=abort_with)
