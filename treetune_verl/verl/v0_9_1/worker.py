# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The V1 agent-loop worker the block's manager runs on verl 0.9.1: each worker-side feature a class of its own,
combined in a stated order.

verl 0.9.1's ``AgentLoopWorkerTQ`` seams (``_run_prompt``, ``_run_agent_loop``, ``_agent_loop_postprocess``) are
overridden by each feature with ``super()`` calls, so the method resolution order is the order they run in,
outermost first; a feature the run does not enable passes its calls on:

1. the live forecast's E (``forecast_eval_worker.ForecastEvalWorkerTQ``): for the uids the manager marked, E's
   requests started at session 0's first turn, put into TransferQueue before that session's row;
2. over-sampling (``over_sample_worker.OverSamplingAgentLoopWorkerTQ``): each training row under its group's
   session, so the trainer's replay buffer can abort the group by uid;
3. managed sessions of several rows (``session_rows_worker.SessionRowsWorkerTQ``): a session's k rows put as k
   rows of its group;
4. verl's ``AgentLoopWorkerTQ``.

Rollout entropy needs no worker of its own here: the rows carry it in ``extra_fields`` and the trainer's seams build
``rollout_entropy`` (``verl/v0_9_1/entropy_rows.py``). verl 0.7.1's worker is ``worker.py``.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("V1 agent-loop worker")  # verl 0.7.1's worker is worker.py

from treetune_verl.verl.v0_9_1.forecast_eval_worker import ForecastEvalWorkerTQ  # noqa: E402
from treetune_verl.verl.v0_9_1.over_sample_worker import OverSamplingAgentLoopWorkerTQ  # noqa: E402

__all__ = ["EntropyAgentLoopWorkerTQ"]


class EntropyAgentLoopWorkerTQ(ForecastEvalWorkerTQ, OverSamplingAgentLoopWorkerTQ):
    """The forecast's E, over-sampling's sessions and managed sessions' rows on verl 0.9.1 (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not redundant: a subclass of verl's @ray.remote class needs an __init__ of its own (over_sample_worker.py).
        super().__init__(*args, **kwargs)
