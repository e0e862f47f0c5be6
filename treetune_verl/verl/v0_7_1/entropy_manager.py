# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's ``AgentLoopManager`` serving entropy-carrying rollouts: where the Hydra block plugs in.

Selected without modifying verl by ``+actor_rollout_ref.rollout.agent.agent_loop_manager_class=
treetune_verl.verl.EntropyAgentLoopManager`` (``ray_trainer.py:823-844`` loads it by name). ``rollout.name``
stays ``sglang``: the FSDP workers look the name up in their own registry (``workers/rollout/base.py:83-101``).
"""

from __future__ import annotations

# ruff: noqa: E402  (verl 0.7.1 only: the guard runs before verl's imports, which fail on verl 0.9.1)
from treetune_verl.verl_guard import VERL

VERL.require("agent-loop manager (verl 0.9.1's: verl/v0_9_1/entropy_manager.py)")

import asyncio
import contextlib
import logging
import time
from typing import Any
from uuid import uuid4

import numpy as np
import ray
import torch
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, _get_rollout_and_model_config
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await

from treetune_verl.agent_loop.over_sample import CompletionCounter, group_sizes
from treetune_verl.batch_keys import (
    CARRIED_ROW_KEY,
    CARRY_RECORD_KEY,
    FORECAST_EVAL_META_KEY,
    HAS_ROLLOUT_ENTROPY_KEY,
    MANAGED_ROW_KEY,
    OVER_SAMPLE_META_KEY,
    PENDING_METRICS_KEY,
    ROLLOUT_ABORTED_KEY,
    ROLLOUT_ABORTED_TOKENS_KEY,
    ROLLOUT_ENTROPY_KEY,
    ROLLOUT_FAILED_KEY,
    ROLLOUT_RESUMED_TOKENS_KEY,
    ROWS_SETTLED_AT_KEY,
    TIMING_KEY,
)
from treetune_verl.forecast.rollout_eval import EVAL_WAIT_METRIC, RolloutEval
from treetune_verl.ppo import advantage  # noqa: F401  (registers grpo_valid / rloo_valid in the trainer's process)
from treetune_verl.rollout.rollout_config import CONFIG_PATH, check_rollout_config
from treetune_verl.timing import OVER_SAMPLING, ROLLOUT_ENTROPY, SECONDS
from treetune_verl.trainer.features import completion_target
from treetune_verl.trainer.metrics import (
    ROWS_WITHOUT_ENTROPY_METRIC,
    batch_abort_metrics,
    managed_session_metrics,
    rollout_entropy_metrics,
)
from treetune_verl.verl.v0_7_1 import trainer_setup
from treetune_verl.verl.v0_7_1.worker import EntropyAgentLoopWorker

logger = logging.getLogger(__name__)


class EntropyAgentLoopManager(AgentLoopManager):
    """``AgentLoopManager`` with the entropy replica and worker, refusing unusable settings before any server starts.

    The replica (``EntropySGLangReplica``) and worker (``EntropyAgentLoopWorker``) classes are set before
    ``super().__init__``, through verl's own hook (it keeps attributes that already exist); a subclass may set
    ``rollout_replica_class`` / ``agent_loop_workers_class`` itself.

    Metrics: verl's trainer logs nothing from the rollout output except ``meta_info["timing"]``, which
    ``ray_trainer.fit`` merges into ``timing_raw`` and logs as ``timing_s/<key>`` (``compute_timing_metrics``), the
    path verl's own ``agent_loop/*`` statistics take. ``_performance_metrics`` adds
    ``agent_loop/rollout_entropy/{mean,p50,p90,max,rows_without_entropy}`` there, so they reach every configured
    logger as ``timing_s/agent_loop/rollout_entropy/...``. What only the trainer sees (the actor's own entropy of the
    same tokens; validation) is logged by the hooks this manager installs in the trainer's process
    (``treetune_verl/verl/v0_7_1/trainer_seams.py``): ``rollout_entropy/actor_abs_diff/{mean,max}`` and ``val-aux/rollout_entropy/...``.

    Over-sampling with abort (``rollout.over_sample_rate`` > 0, training batches only): each step gets a
    :func:`completion_target` of whole groups on a :class:`CompletionCounter` shared by the workers, which abort the
    rest (``over_sample_worker.py``); ``rollout/wall_time_s`` and the aborted-row metrics reach the step's metrics.
    With carry-over (``custom.over_sample.carry_over``) the aborted groups are resumed at the next step:
    :attr:`carry_over` (``carry_over.py``) holds them, the trainer's ``_get_gen_batch`` seam gives them their slots,
    and this manager hands each row what it resumes from and keeps what the aborted rows generated
    (``rollout/carry_over/...`` metrics).

    The live forecast (``rollout.custom.entropy_forecast``): on its training steps the workers also sample E, the
    forecast's fresh responses, on the same servers while the batch's rollout runs, and this manager hands them to the
    actor beside the batch (:attr:`rollout_eval`, ``forecast/rollout_eval.py``; ``probe/eval_gen_{s,token_share}``).

    The trainer-side features (the agreement and validation metrics, aborted rows' reward, entropy steering) run in
    the trainer's own seams, installed here with the run's features read from the trainer's config
    (``treetune_verl/verl/v0_7_1/trainer_setup.py``, which also refuses combinations that cannot run).

    Raises:
        ValueError: ``rollout.name`` is not ``sglang``, ``calculate_log_probs`` is off, the entropy section is
            invalid, or a feature is refused at start-up (:func:`~treetune_verl.trainer.features.check_features`:
            e.g. ``over_sample_rate`` out of range or with settings that would train on aborted rows wrongly).
        UnsupportedSGLangError: data-parallel sglang, speculative decoding (MTP), pipeline parallelism or
            disaggregation.
        UnsupportedVerlError: a verl other than 0.7.1 (the trainer hooks would be wrong).
    """

    def __init__(
        self,
        config: DictConfig,
        worker_group: Any = None,
        rollout_resource_pool: Any = None,
        reward_loop_worker_handles: list[Any] | None = None,
    ) -> None:
        rollout_config, _ = _get_rollout_and_model_config(config)
        if rollout_config.get("name") != "sglang":
            raise ValueError(
                f"{CONFIG_PATH}.name must be sglang for rollout entropy (got {rollout_config.get('name')!r}); the "
                "entropy server is selected by this manager, not by the rollout name"
            )
        check_rollout_config(rollout_config)
        # This process is the trainer's (fit runs here): check the run's features and install the trainer's seams.
        run = trainer_setup.install(config)
        features = run.features
        self._over_sample_rate, self._abort_failed_rows = features.over_sample_rate, features.abort_failed_rows
        # Started before training (a Ray actor takes seconds to start): one per manager, a key per step.
        self._completion_counter: Any = CompletionCounter.remote() if features.aborts_rows else None
        self.carry_over = run.carry_over  # the trainer's seams hold the same buffer (trainer_setup)
        self.rollout_eval = RolloutEval(features.forecast, rollout_config) if features.forecast is not None else None
        if not hasattr(self, "rollout_replica_class"):
            # Imported here: it imports sglang, which only the processes that start servers need.
            from treetune_verl.rollout.replica import EntropySGLangReplica

            self.rollout_replica_class = EntropySGLangReplica
        if not hasattr(self, "agent_loop_workers_class"):
            self.agent_loop_workers_class = ray.remote(EntropyAgentLoopWorker)
        self._validation_rollouts: list[DataProto] = []
        super().__init__(config, worker_group, rollout_resource_pool, reward_loop_worker_handles)

    @auto_await
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The parent's ``generate_sequences``, over-sampled when configured (never in validation).

        Validation rollouts are also kept for their entropy metrics.
        """
        validate = prompts.meta_info.get("validate", False)
        self._timing_on = not validate  # validation's seconds are not a training step's
        step, reached = None, None
        if not validate and self._completion_counter is not None:
            step = await self._begin_over_sample(prompts)
            reached = asyncio.ensure_future(self._target_reached_at(step))
        eval_due = self.rollout_eval is not None and self.rollout_eval.due(prompts)
        if eval_due:
            self.rollout_eval.mark(prompts)
        start = time.perf_counter()
        try:
            output = await super().generate_sequences(prompts)
        finally:
            end, end_wall = time.perf_counter(), time.time()
            if step is not None:
                prompts.meta_info.pop(OVER_SAMPLE_META_KEY, None)
                await self._completion_counter.end.remote(step)  # wakes the wait below if the target was not reached
                reached_at = await reached
                SECONDS.waited(OVER_SAMPLING, time.perf_counter() - end)
        # when the last worker's rows had settled (time.time(), one clock on one machine); after it, the step waited
        # for the forecast's E of the kept groups (forecast_eval_worker.py)
        settled_at = [at for at in output.non_tensor_batch.pop(ROWS_SETTLED_AT_KEY, []) if at is not None]
        rows_end = min(max(settled_at), end_wall) if settled_at else end_wall
        abort_metrics, carry_metrics = {}, {}
        aborted_tokens = output.batch.pop(ROLLOUT_ABORTED_TOKENS_KEY, None)  # the worker's, for the metrics only
        if step is not None:
            if aborted_tokens is None:
                raise RuntimeError(
                    f"over-sampling: the agent-loop workers sent no {ROLLOUT_ABORTED_TOKENS_KEY} column (a worker class "
                    "that is not EntropyAgentLoopWorker or a subclass of it?)"
                )
            uids = prompts.non_tensor_batch["uid"]  # the manager refused a batch without it (_begin_over_sample)
            carried = np.zeros(len(uids), dtype=bool)
            if self.carry_over is not None:
                with SECONDS.timed(OVER_SAMPLING):
                    carry_metrics = self._keep_aborted(prompts, output)
                    carried = np.array([self.carry_over.carried(str(uid)) is not None for uid in uids])
            # target reached -> every worker's rows settled (aborted ones cut, forgotten): the step waiting on the
            # abort, as verl 0.9.1's replay buffer measures it (over_sample_sampler.py)
            abort_wait = max(0.0, rows_end - reached_at) if reached_at is not None else 0.0
            SECONDS.waited(OVER_SAMPLING, abort_wait)
            with SECONDS.timed(OVER_SAMPLING):
                # aborted = dropped, as on verl 0.9.1: a carried group's rows are the carry-over metrics' (their empty
                # rows in this batch are verl's response/aborted_ratio)
                rows = torch.from_numpy(~carried)
                batch = output.batch
                abort_metrics = batch_abort_metrics(
                    uids[~carried],
                    batch[ROLLOUT_ABORTED_KEY][rows],
                    batch[ROLLOUT_FAILED_KEY][rows],
                    aborted_tokens[rows],
                    abort_wait,
                )
        managed_rows = output.non_tensor_batch.pop(MANAGED_ROW_KEY, None)
        for seconds in output.non_tensor_batch.pop(TIMING_KEY, []):  # the workers' (timing.py)
            if seconds and not validate:
                SECONDS.add_cpu(seconds)
        if validate:
            keys = [ROLLOUT_ENTROPY_KEY, "response_mask", HAS_ROLLOUT_ENTROPY_KEY]
            self._validation_rollouts.append(output.select(batch_keys=keys, non_tensor_batch_keys=[]))
        else:
            pending = output.meta_info.setdefault(PENDING_METRICS_KEY, {})
            pending["rollout/wall_time_s"] = time.perf_counter() - start
            pending.update(abort_metrics)
            pending.update(carry_metrics)
            if managed_rows is not None:
                pending.update(managed_session_metrics(list(managed_rows)))
            if eval_due:
                output.meta_info[FORECAST_EVAL_META_KEY], eval_metrics = self.rollout_eval.collect(prompts, output)
                pending.update(eval_metrics)
                pending[EVAL_WAIT_METRIC] = end_wall - rows_end  # the step's wait for E once every row was settled
            elif self.rollout_eval is not None:
                output.meta_info[FORECAST_EVAL_META_KEY] = None  # the actor follows the rollout: no forecast
        return output

    def _keep_aborted(self, prompts: DataProto, output: DataProto) -> dict[str, float]:
        """Hand the step's aborted groups to :attr:`carry_over`; its metrics. Our columns leave both batches."""
        resumed = prompts.non_tensor_batch.pop(CARRIED_ROW_KEY)
        output.non_tensor_batch.pop(CARRIED_ROW_KEY, None)  # verl copies the prompts' columns into the output
        aborted = output.batch[ROLLOUT_ABORTED_KEY]
        resumed_tokens = [len(row) if row is not None else 0 for row in resumed]
        output.batch[ROLLOUT_RESUMED_TOKENS_KEY] = torch.tensor(resumed_tokens, dtype=torch.int64) * ~aborted
        return self.carry_over.keep_aborted(
            uids=prompts.non_tensor_batch["uid"],
            resumed=resumed,
            records=output.non_tensor_batch.pop(CARRY_RECORD_KEY),
            aborted=aborted.numpy(),
            failed=output.batch[ROLLOUT_FAILED_KEY].numpy(),
            trained_tokens=output.batch["response_mask"].sum(-1).numpy(),
            step=prompts.meta_info.get("global_steps", 0),
        )

    async def _target_reached_at(self, step: str) -> float | None:
        """When ``step``'s target was reached (``time.time()``: the workers' clock too), or ``None`` if the step
        ended first (failures left fewer whole groups than the target)."""
        reached = await self._completion_counter.wait.remote(step)
        return time.time() if reached else None

    async def _begin_over_sample(self, prompts: DataProto) -> str:
        """Start a step at the counter and put its plan into ``prompts.meta_info`` for the workers; its key.

        Failed rows aborted without over-sampling: the target is every group (nothing is cut; a group with a failed
        row is dropped whole). Its synchronous work is over-sampling's (``timing.py``), the counter's answer a wait of
        the step.
        """
        with SECONDS.timed(OVER_SAMPLING):
            uids = prompts.non_tensor_batch.get("uid")
            sizes = group_sizes(uids)
            step, target = uuid4().hex, completion_target(self._over_sample_rate, len(sizes))
        begun = time.perf_counter()
        await self._completion_counter.begin.remote(step, target, sizes)
        SECONDS.waited(OVER_SAMPLING, time.perf_counter() - begun)
        with SECONDS.timed(OVER_SAMPLING):
            if self.carry_over is not None:
                prompts.non_tensor_batch[CARRIED_ROW_KEY] = self.carry_over.resume_column(uids)
            prompts.meta_info[OVER_SAMPLE_META_KEY] = {
                "counter": self._completion_counter,
                "step": step,
                "target": target,
                "abort_failed_rows": self._abort_failed_rows,
                "carry_over": self.carry_over is not None,
                "global_step": int(prompts.meta_info.get("global_steps", 0)),
            }
        return step

    def take_validation_metrics(self) -> dict[str, float]:
        """Rollout-entropy metrics over every validation rollout since the last call (``{}`` if none).

        verl's ``_validate`` logs nothing of the generation output but rewards; the trainer hook
        (``treetune_verl/verl/v0_7_1/trainer_seams.py``) calls this at the end of each validation and logs the result as
        ``val-aux/rollout_entropy/...``.
        """
        rollouts, self._validation_rollouts = self._validation_rollouts, []
        if not rollouts:
            return {}
        batch = DataProto.concat(rollouts).batch
        return rollout_entropy_metrics(
            batch[ROLLOUT_ENTROPY_KEY], batch["response_mask"], batch.get(HAS_ROLLOUT_ENTROPY_KEY)
        )

    def _performance_metrics(self, metrics: list[list[dict[str, Any]]], output: DataProto) -> dict[str, float]:
        timing = super()._performance_metrics(metrics, output)
        batch = output.batch
        timed = SECONDS.timed(ROLLOUT_ENTROPY) if getattr(self, "_timing_on", True) else contextlib.nullcontext()
        with timed:
            entropy_metrics = rollout_entropy_metrics(
                batch[ROLLOUT_ENTROPY_KEY], batch["response_mask"], batch.get(HAS_ROLLOUT_ENTROPY_KEY, None)
            )
        if entropy_metrics.get(ROWS_WITHOUT_ENTROPY_METRIC) and not getattr(self, "_warned_rows_without", False):
            self._warned_rows_without = True
            logger.warning(
                "%d of %d rollout rows came from agent loops that carry no entropy (stock verl loops?); they are "
                "marked has_rollout_entropy=False and left out of the entropy metrics. Use the entropy loops: "
                "README, 'Rollout entropy in verl'.",
                int(entropy_metrics[ROWS_WITHOUT_ENTROPY_METRIC]),
                len(batch[ROLLOUT_ENTROPY_KEY]),
            )
        timing.update(entropy_metrics)
        return timing
