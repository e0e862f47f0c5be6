# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's ``AgentLoopWorker`` with session-named trajectories and over-sampling with abort.

Every trajectory runs under its own session (:mod:`treetune_verl.rollout.session`), named in the request id of each
of its turns by :class:`~treetune_verl.verl.v0_7_1.session_server_manager.SessionServerManager`. When the manager put
an over-sampling plan into ``prompts.meta_info`` (training batches with ``rollout.over_sample_rate > 0``), the worker
keeps a trajectory only if its group (its ``uid``) is one of the step's kept groups at the batch-wide counter, and
aborts the rest once the target of whole groups is reached (:class:`~treetune_verl.agent_loop.over_sample.OverSampleStep`).

An aborted row reaches verl's trainer as an empty response, exactly as verl's own metrics define an aborted sample
(``metric_utils.py:122``: response length 0): response ids padding, ``attention_mask`` and ``response_mask`` 0 over
the response, log-probs 0, reward 0; ``batch["rollout_aborted"]`` marks it. The same empty row stands for a kept
trajectory that produced no token, which verl's ``_agent_loop_postprocess`` cannot pad (``.dim()`` on lists).
"""

from __future__ import annotations

# ruff: noqa: E402  (verl 0.7.1 only: the guard runs before verl's imports, which fail on verl 0.9.1)
from treetune_verl.verl_guard import VERL

VERL.require("over-sampling worker (verl 0.9.1's: verl/v0_9_1/over_sample_worker.py)")

import asyncio
import contextlib
import logging
from contextvars import ContextVar
from typing import Any

import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopMetrics,
    AgentLoopOutput,
    AgentLoopWorker,
    _InternalAgentLoopOutput,
)
from verl.protocol import DataProto

from treetune_verl.agent_loop.over_sample import OverSampleStep, plan_of
from treetune_verl.agent_loop.trajectory import CURRENT_TRAJECTORY, Trajectory
from treetune_verl.batch_keys import (
    RESPONSE_ENTROPY_KEY,
    ROLLOUT_ABORTED_KEY,
    ROLLOUT_ABORTED_TOKENS_KEY,
    ROLLOUT_FAILED_KEY,
)
from treetune_verl.rollout.session import new_session_id
from treetune_verl.timing import OVER_SAMPLING, SECONDS
from treetune_verl.verl.v0_7_1.session_server_manager import SessionServerManager

_CURRENT_STEP: ContextVar[OverSampleStep | None] = ContextVar("treetune_over_sample_step", default=None)
logger = logging.getLogger(__name__)


class OverSamplingAgentLoopWorker(AgentLoopWorker):
    """``AgentLoopWorker`` running each trajectory under a session, aborting the long tail when over-sampling.

    ``batch["rollout_aborted"]`` (bool ``[batch]``) is always emitted; all ``False`` without over-sampling and in
    validation batches, which never abort.
    """

    def __init__(
        self,
        config: Any,
        servers: list[tuple[str, Any]],
        load_balancer_handle: Any,
        reward_loop_worker_handles: list[Any] | None = None,
    ) -> None:
        if not hasattr(self, "server_manager"):  # verl's own hook for recipes (agent_loop.py:420)
            self.server_manager = SessionServerManager(config, servers, load_balancer_handle=load_balancer_handle)
        super().__init__(config, servers, load_balancer_handle, reward_loop_worker_handles)

    async def generate_sequences(self, batch: DataProto) -> DataProto:
        plan = plan_of(batch.meta_info)
        if plan is None:
            return await super().generate_sequences(batch)
        if self.processor is not None:
            raise NotImplementedError("over-sampling with a multi-modal processor is not supported")
        step = OverSampleStep(
            plan["counter"],
            plan["step"],
            abort_failed_rows=plan["abort_failed_rows"],
            global_step=plan["global_step"],
            carry_over=plan["carry_over"],
        )
        token = _CURRENT_STEP.set(step)  # copied into every trajectory task the parent creates
        watcher = asyncio.create_task(step.abort_when_target_reached(self.server_manager))
        try:
            return await super().generate_sequences(batch)
        finally:
            _CURRENT_STEP.reset(token)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if step.aborted_sessions:  # on the step's path: inside the manager's rollout/abort_wait_s
                await self.server_manager.forget_sessions(step.aborted_sessions)

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any):
        step = _CURRENT_STEP.get()
        session = new_session_id()
        group = None
        if step is not None:
            step.open(session)
            group = str(kwargs["uid"])  # the manager refused a batch without the column (over_sample.group_sizes)
        token = CURRENT_TRAJECTORY.set(Trajectory(session=session, step=step, group=group))
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        except Exception:
            # Only a failure of the agent loop itself (before its row was settled) becomes an aborted row; one in
            # verl's postprocessing of a settled row stops the step as before.
            if step is None or not step.abort_failed_rows or not step.is_open(session):
                raise
            self._log_failed_row(kwargs)
            step.failed_sessions.add(session)
            # what verl's _run_agent_loop hands its postprocessing: the row's fields, not its own two parameters
            row_fields = {k: v for k, v in kwargs.items() if k not in ("agent_name", "trace")}
            return await self._agent_loop_postprocess(self._failed_row_output(kwargs), **row_fields)
        finally:
            CURRENT_TRAJECTORY.reset(token)

    def _log_failed_row(self, kwargs: dict[str, Any]) -> None:
        """The first failure of this worker with its traceback, later ones in one line (each counts in
        ``rollout/failed_rows``)."""
        self._failed_rows = getattr(self, "_failed_rows", 0) + 1
        where = f"agent loop {kwargs.get('agent_name')!r}, uid {kwargs.get('uid')!r}"
        if self._failed_rows == 1:
            logger.exception("%s raised: its row becomes an aborted row and its group is dropped", where)
        else:
            logger.warning(
                "%s raised (failed row %d of this worker; traceback of the first above)", where, self._failed_rows
            )

    def _failed_row_output(self, kwargs: dict[str, Any]) -> AgentLoopOutput:
        """An empty output for a row whose loop raised: the chat prompt (as verl's single-turn loop encodes it,
        truncated from the left to ``prompt_length``), no response."""
        prompt_ids = self.tokenizer.apply_chat_template(
            list(kwargs["raw_prompt"]), add_generation_prompt=True, tokenize=True
        )
        prompt_ids = list(prompt_ids)[-self.rollout_config.prompt_length :]
        # No token, so no entropy: an empty list (not a loop that carries none, which the metrics would count).
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=[],
            response_mask=[],
            num_turns=0,
            metrics=AgentLoopMetrics(),
            extra_fields={RESPONSE_ENTROPY_KEY: []},
        )

    async def _agent_loop_postprocess(self, output: AgentLoopOutput, **kwargs: Any) -> _InternalAgentLoopOutput:
        trajectory = CURRENT_TRAJECTORY.get()
        keep, failed = True, False
        if trajectory is not None and trajectory.step is not None:
            failed = trajectory.session in trajectory.step.failed_sessions
            # awaited, not timed: a row waiting for its group's decision is not our work, and the step's wait for
            # the decision is the manager's rollout/abort_wait_s (timing.py)
            keep = await trajectory.step.settle(trajectory.session, trajectory.group, failed)
        if keep and output.response_ids:
            internal = await super()._agent_loop_postprocess(output, **kwargs)
        else:
            internal = await self._empty_response_postprocess(output, **kwargs)
        internal.extra_fields[ROLLOUT_ABORTED_KEY] = not keep
        internal.extra_fields[ROLLOUT_FAILED_KEY] = failed
        internal.extra_fields[ROLLOUT_ABORTED_TOKENS_KEY] = 0 if keep else len(output.response_ids)
        return internal

    async def _empty_response_postprocess(self, output: AgentLoopOutput, **kwargs: Any) -> _InternalAgentLoopOutput:
        """The parent's postprocessing of a row whose response is empty (aborted, or no token produced).

        The parent cannot pad an empty response, so it runs on a one-token placeholder (padding, mask 0) whose
        attention is then removed and the position ids recomputed by verl's own ``_compute_position_ids``. The reward
        workers still score the row (verl needs every row's reward extras, ``agent_loop.py:840``); the trainer hook
        sets an aborted row's reward to 0 (``treetune_verl/verl/v0_7_1/trainer_seams.py``).
        """
        update: dict[str, Any] = {
            "response_ids": [self.tokenizer.pad_token_id],
            "response_mask": [0],
            "response_logprobs": [0.0] if self.rollout_config.calculate_log_probs else None,
            "routed_experts": None,
        }
        internal = await super()._agent_loop_postprocess(output.model_copy(update=update), **kwargs)
        with SECONDS.timed(OVER_SAMPLING):
            prompt_length = internal.prompt_ids.shape[1]
            internal.attention_mask[:, prompt_length:] = 0
            internal.response_mask.zero_()
            internal.position_ids = self._compute_position_ids(
                internal.input_ids, internal.attention_mask, internal.multi_modal_inputs
            )
        return internal

    def _postprocess(
        self, inputs: list[_InternalAgentLoopOutput], input_non_tensor_batch: dict | None = None
    ) -> DataProto:
        aborted = [bool(item.extra_fields.pop(ROLLOUT_ABORTED_KEY, False)) for item in inputs]
        failed = [bool(item.extra_fields.pop(ROLLOUT_FAILED_KEY, False)) for item in inputs]
        aborted_tokens = [int(item.extra_fields.pop(ROLLOUT_ABORTED_TOKENS_KEY, 0)) for item in inputs]
        data = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch)
        data.batch[ROLLOUT_ABORTED_KEY] = torch.tensor(aborted, dtype=torch.bool)
        data.batch[ROLLOUT_FAILED_KEY] = torch.tensor(failed, dtype=torch.bool)
        data.batch[ROLLOUT_ABORTED_TOKENS_KEY] = torch.tensor(aborted_tokens, dtype=torch.int64)
        return data
