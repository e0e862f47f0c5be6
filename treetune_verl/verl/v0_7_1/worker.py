# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The agent-loop worker the manager runs: each worker-side feature a class of its own, combined in a stated order.

verl 0.7.1's ``AgentLoopWorker`` seams (``_run_agent_loop``, ``_agent_loop_postprocess``, ``_postprocess``,
``generate_sequences``) are overridden by each feature with ``super()`` calls, so the method resolution order is the
order they run in, outermost first:

0. managed sessions of several rows (``session_rows_worker.SessionRowsWorker``): a session's k rows become k
   consecutive rows of its prompt, each passing the features below as a row of its own;
1. the live forecast's E (``forecast_eval_worker.ForecastEvalWorker``): on the rows the manager marked, E's requests
   started at the row's first turn, in the same server batches as the rest of the batch;
2. carry-over (``carry_over_worker.CarryOverWorker``): resumes a carried row with the continuation loop, records
   what an aborted row generated before it is emptied;
3. rollout entropy (``entropy_worker.RolloutEntropyWorker``): pads each row's entropy once the row is final;
4. sessions and over-sampling with abort (``over_sample_worker.OverSamplingAgentLoopWorker``): names every
   trajectory's requests, settles it by its group or aborts it, empties an aborted row, marks ``rollout_aborted``;
5. verl's ``AgentLoopWorker``.

The CPU seconds the features spent in this worker for a batch (``treetune_verl/timing.py``) leave with the batch, on
its first row (``batch_keys.TIMING_KEY``), for the manager to add to the step's. Importing this module registers the
entropy agent loops in verl's registry of the worker's process.
"""

from __future__ import annotations

# ruff: noqa: E402  (verl 0.7.1 only: the guard runs before verl's imports, which fail on verl 0.9.1)
from treetune_verl.verl_guard import VERL

VERL.require("agent-loop worker (verl 0.9.1's: verl/v0_9_1/worker.py)")

from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import _InternalAgentLoopOutput
from verl.protocol import DataProto

# Importing the loops registers their names in this process's verl agent-loop registry.
from treetune_verl.agent_loop import continuation_agent_loop, entropy_single_turn_agent_loop  # noqa: F401
from treetune_verl.agent_loop.entropy_worker import RolloutEntropyWorker
from treetune_verl.batch_keys import TIMING_KEY
from treetune_verl.timing import SECONDS
from treetune_verl.verl.v0_7_1 import entropy_tool_agent_loop  # noqa: F401
from treetune_verl.verl.v0_7_1.carry_over_worker import CarryOverWorker
from treetune_verl.verl.v0_7_1.forecast_eval_worker import ForecastEvalWorker
from treetune_verl.verl.v0_7_1.over_sample_worker import OverSamplingAgentLoopWorker
from treetune_verl.verl.v0_7_1.session_rows_worker import SessionRowsWorker


class EntropyAgentLoopWorker(
    SessionRowsWorker, ForecastEvalWorker, CarryOverWorker, RolloutEntropyWorker, OverSamplingAgentLoopWorker
):
    """``batch["rollout_entropy"]`` / ``has_rollout_entropy``, ``batch["rollout_aborted"]``, carried rows, managed
    sessions' rows and the live forecast's E (module docstring)."""

    def _postprocess(
        self, inputs: list[_InternalAgentLoopOutput], input_non_tensor_batch: dict | None = None
    ) -> DataProto:
        data = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch)
        seconds: list[Any] = [None] * len(data)
        if seconds:
            seconds[0] = SECONDS.take().cpu  # this batch's CPU seconds (a worker runs one batch at a time)
        data.non_tensor_batch[TIMING_KEY] = np.array(seconds, dtype=object)
        return data
