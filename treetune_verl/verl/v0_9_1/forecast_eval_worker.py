# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: the live forecast's E, sampled by the V1 agent-loop worker while the step's rollout runs.

The same E as verl 0.7.1's ``forecast_eval_worker.py`` (``forecast/rollout_eval.py``), on the V1 worker, which runs a
prompt's ``n`` sessions in ``_run_prompt`` (``agent_loop_tq.py:107``) and puts each session's row into TransferQueue
in ``_agent_loop_postprocess``; the uid's status becomes ``finished`` once every session has put its row:

- the manager marks E's uids with an ``EvalPlan`` (``FORECAST_EVAL_PLAN_KEY``, a column of the prompts);
  ``_run_prompt`` takes it off the prompt (it would otherwise become a field of every row) and keeps it for the uid;
- session 0 of a marked uid runs with ``trajectory.PROMPT_HOOK`` set: when it sends its first turn (the prompt ids as
  the loop rendered them; ``SessionLLMServerClient`` calls the hook), E's G requests start in a task of their own and
  decode in the same server batches as the step's rows; a session that sends no turn starts E from the prompt ids it
  returns;
- session 0's ``_agent_loop_postprocess`` waits for E and puts it into TransferQueue
  (``verl/v0_9_1/rollout_eval.py``) before its row, so a finished uid has its E there. E failing costs the forecast
  that prompt (a warning), not the row; a session that raises leaves no request of E behind.

E's requests are not turns of session 0 (a fresh context: ``rollout_eval.start_sampling``) but are named after the
uid's group session (``session.eval_request_id``), so over-sampling's abort of the group cuts them with its rows: a
dropped group's E is left out (``EvalCut``) instead of holding the group, and the step after the target, until it
decodes to its end (issue 49's bench: 0.8-0.9 s of the abort wait on SmolLM2). E of a kept group is whole.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from treetune_verl.agent_loop.trajectory import PROMPT_HOOK
from treetune_verl.batch_keys import FORECAST_EVAL_PLAN_KEY
from treetune_verl.forecast.rollout_eval import EvalCut, EvalPlan, start_sampling
from treetune_verl.rollout.session import group_session_id
from treetune_verl.verl.v0_9_1.rollout_eval import put_sampled
from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("V1 forecast worker")  # verl 0.7.1's worker is forecast_eval_worker.py

from treetune_verl.verl.v0_9_1.session_rows_worker import SessionRowsWorkerTQ  # noqa: E402

__all__ = ["ForecastEvalWorkerTQ"]

logger = logging.getLogger(__name__)
SAMPLING_SESSION = 0  # the session of a marked uid whose first turn starts E


class ForecastEvalWorkerTQ(SessionRowsWorkerTQ):
    """Samples E for the uids the manager marked, beside their rows (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not redundant: a subclass of verl's @ray.remote class needs an __init__ of its own (over_sample_worker.py).
        super().__init__(*args, **kwargs)
        self._eval_plans: dict[str, EvalPlan] = {}  # uid -> its plan, while its prompt runs
        self._eval_tasks: dict[str, asyncio.Task] = {}  # uid -> its E, from the first turn to session 0's row

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        plan: EvalPlan | None = prompt.pop(FORECAST_EVAL_PLAN_KEY, None)
        if plan is None:
            return await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, trace=trace)
        uid = str(prompt["uid"])
        self._eval_plans[uid] = plan
        try:
            return await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, trace=trace)
        finally:
            self._eval_plans.pop(uid, None)
            task = self._eval_tasks.pop(uid, None)
            if task is not None:
                task.cancel()  # session 0 raised before its row: no request of E left running

    def _plan(self, kwargs: dict[str, Any]) -> EvalPlan | None:
        """The plan of the session these agent-loop kwargs are for, when it is the one that samples E."""
        if kwargs.get("session_id") != SAMPLING_SESSION:
            return None
        return self._eval_plans.get(str(kwargs.get("uid")))

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any) -> Any:
        plan = self._plan(kwargs)
        if plan is None:
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        uid = str(kwargs["uid"])
        token = PROMPT_HOOK.set(lambda prompt_ids: self._start_eval(uid, prompt_ids, plan))
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        finally:
            PROMPT_HOOK.reset(token)

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        plan = self._plan(kwargs)
        if plan is not None:
            uid = str(kwargs["uid"])
            first = (output[0] if output else None) if isinstance(output, list) else output
            if first is not None:  # a session that sent no turn: E from the prompt it returns
                self._start_eval(uid, list(first.prompt_ids), plan)
            await self._put_eval(uid)
        return await super()._agent_loop_postprocess(output, validate, **kwargs)

    def _start_eval(self, uid: str, prompt_ids: list[int], plan: EvalPlan) -> None:
        start_sampling(self._eval_tasks, uid, prompt_ids, plan, self.llm_client, abort_with=group_session_id(uid))

    async def _put_eval(self, uid: str) -> None:
        """Wait for ``uid``'s E and put it into TransferQueue; E cut by its group's abort is left out, E failing is
        logged, and the row goes on."""
        task = self._eval_tasks.pop(uid, None)
        if task is None:
            return
        try:
            await put_sampled(uid, await task)
        except EvalCut:
            logger.info(
                "entropy forecast: E of uid %s was cut with its dropped group; the forecast goes without it", uid
            )
        except Exception:
            logger.warning("entropy forecast: E of uid %s failed; the forecast goes without it", uid, exc_info=True)
