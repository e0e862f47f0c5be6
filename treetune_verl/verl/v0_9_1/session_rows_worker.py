# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: managed sessions that train several rows, in the V1 trainer's ``AgentLoopWorkerTQ``.

The same contract as verl 0.7.1's ``session_rows_worker.py``: with ``rollout.custom.managed.rows_per_session = k``
a prompt's ``n`` rows (its GRPO group, ``rollout.n`` or the prompt's ``__rollout_n__``) are ``n / k`` managed
sessions of k rows each, every row with its own reward. On verl 0.9.1 a prompt's sessions run in one worker
(``AgentLoopWorkerTQ._run_prompt``, ``agent_loop_tq.py:107``), so here:

- ``_run_prompt`` starts ``n / k`` sessions of a managed training prompt instead of ``n`` (verl's own per-prompt
  ``__rollout_n__``);
- ``_agent_loop_postprocess`` puts each of a session's k rows into TransferQueue as a session of its own, number
  ``session * k + i``, keys ``{uid}_{session * k + i}_0``. verl reads a session's list of outputs as the segments of
  one trajectory (it copies the last output's reward over the others, ``:172``, and its GRPO advantage and
  validation metrics use the session's last output only, ``utils.py:178``, ``trainer_base.py:1086``); branches are
  not segments, so each is scored, advantaged and logged as a row of the group.

Validation runs one session per row and keeps its first row, as on verl 0.7.1. A managed session returning another
number of rows than k fails its prompt (verl logs the error naming the uid; the prompt's status is ``failure``).
"""

from __future__ import annotations

import logging
from typing import Any

from treetune_verl.agent_loop.loop_registry import is_managed
from treetune_verl.batch_keys import MANAGED_ROW_KEY
from treetune_verl.rollout.rollout_config import ROWS_PER_SESSION_KEY, rows_per_session
from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("V1 session-rows worker")  # verl 0.7.1's worker is session_rows_worker.py

import transfer_queue as tq  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput  # noqa: E402
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ  # noqa: E402

logger = logging.getLogger(__name__)

ROLLOUT_N_KEY = "__rollout_n__"  # verl's per-prompt row count (agent_loop_tq.py:115)


class SessionRowsWorkerTQ(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl 0.9.1's TransferQueue agent-loop worker giving each of a managed session's k rows a session number of its
    own (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not redundant: a subclass of verl's @ray.remote class needs an __init__ of its own (over_sample_worker.py).
        super().__init__(*args, **kwargs)
        self._rows_per_session = rows_per_session(self.rollout_config)

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        k = self._rows_per_session
        if k > 1 and not trajectory["validate"] and is_managed(prompt["agent_name"]):
            n = int(prompt.get(ROLLOUT_N_KEY, self.rollout_config.n))
            if n % k:  # failed as verl fails a prompt: logged, its status "failure" (nothing else publishes it)
                logger.error(
                    f"uid {prompt['uid']!r}: {n} rows (rollout.n or the prompt's {ROLLOUT_N_KEY}) are not a multiple "
                    f"of {ROWS_PER_SESSION_KEY}={k}"
                )
                await tq.async_kv_put(key=prompt["uid"], partition_id="train", tag={"status": "failure"})
                return
            prompt = {**prompt, ROLLOUT_N_KEY: n // k}
        return await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, trace=trace)

    async def _agent_loop_postprocess(
        self, output: AgentLoopOutput | list[AgentLoopOutput], validate: bool, **kwargs: Any
    ) -> None:
        outputs = output if isinstance(output, list) else [output]
        if not outputs or not all(MANAGED_ROW_KEY in row.extra_fields for row in outputs):
            return await super()._agent_loop_postprocess(output, validate, **kwargs)
        if validate:
            outputs = outputs[:1]
        elif len(outputs) != self._rows_per_session:
            raise ValueError(
                f"uid {kwargs.get('uid')!r}: the managed agent returned {len(outputs)} rows; "
                f"{ROWS_PER_SESSION_KEY}={self._rows_per_session}"
            )
        first = kwargs.pop("session_id") * len(outputs)
        for i, row in enumerate(outputs):  # each row its own session: scored and advantaged as a row of the group
            await super()._agent_loop_postprocess(row, validate, session_id=first + i, **kwargs)
