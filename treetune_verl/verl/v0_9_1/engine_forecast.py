# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast around verl 0.9.1's engine-worker actor update: what it uses of the worker and of its batch.

verl 0.9.1's actor is the ``TrainingWorker`` of ``engine_workers.ActorRolloutRefWorker`` (``worker.actor``): its
``engine`` (``FSDPEngine``) holds the policy (``engine.module``, FSDP2-wrapped), the optimizer (``engine.optimizer``)
and the optimizer step (``engine.optimizer_step()``: clipping, then the step; ``engine/fsdp/transformer_impl.py:788``),
looked up on the instance by ``BaseEngine.train_batch`` (``engine/base.py:128``), so :meth:`ForecastRun.around`
routes it. The batch is a ``TensorDict`` of this rank's rows, unpadded (nested ``prompts`` ``[N, (P_i)]``,
``responses`` ``[N, (R_i)]``), whose non-tensor fields carry each row's ``uid`` and what the V1 trainer put in
``KVBatchMeta.extra_info`` (``trainer_base.py`` ``_update_actor``): the rollout's ``temperature``, and the rollout's E
under ``FORECAST_EVAL_META_KEY`` when it sampled one. Without it E is sampled here, from the prompts of the batch
(``live.py``), with the response budget ``rollout.response_length``.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY
from treetune_verl.forecast.live import (
    ActorView,
    ForecastRun,
    ForecastState,
    UpdateInputs,
    eos_token_ids,
    rows_per_forward,
)
from treetune_verl.forecast.settings import ForecastSettings
from treetune_verl.forecast.verl_batch import eval_prompts

__all__ = ["engine_forecast", "prompts_by_uid"]


def _field(data: Any, key: str) -> Any:
    """A non-tensor field of verl's ``TensorDict`` (a ``NonTensorData``'s value, a ``NonTensorStack``'s list), or
    None."""
    from verl.utils import tensordict_utils as tu

    return tu.get(data, key, default=None)


def prompts_by_uid(data: Any) -> dict[str, list[int]]:
    """uid -> prompt ids of this rank's rows of verl 0.9.1's actor batch (``uid``, nested ``prompts``).

    Raises:
        ValueError: no ``uid`` or no ``prompts`` in the batch.
    """
    uids = _field(data, "uid")
    if uids is None or "prompts" not in data:
        raise ValueError(
            "entropy forecast: the actor's batch has no 'uid' / 'prompts' (verl's prompt-group id and prompt ids), "
            "so E's prompts cannot be taken from it"
        )
    return {str(uid): prompt.tolist() for uid, prompt in zip(uids, data["prompts"].unbind(0), strict=True)}


def engine_forecast(worker: Any, data: Any, settings: ForecastSettings, state: ForecastState) -> ForecastRun:
    """The forecast around ``worker.update_actor(data)`` (verl 0.9.1's ``ActorRolloutRefWorker``), E taken or
    sampled now, at θ.

    Args:
        worker: ``actor`` (``TrainingWorker``: ``engine``, ``engine_config``, ``model_config``: tokenizer, generation
            config), ``config`` (``actor_rollout_ref``: ``rollout.n``, ``rollout.response_length``).
        data: this rank's batch (``temperature``; ``uid`` and ``prompts``, or the rollout's E).

    Raises:
        ValueError: no ``temperature`` in the batch.
    """
    training = worker.actor
    engine, engine_config = training.engine, training.engine_config
    rollout = worker.config.rollout
    width = int(rollout.prompt_length) + int(rollout.response_length)  # the widest row
    rows = rows_per_forward(engine_config.micro_batch_size_per_gpu, engine_config.max_token_len_per_gpu, width)
    temperature = _field(data, "temperature")
    if temperature is None:
        raise ValueError("entropy forecast: the actor's batch has no 'temperature' (the V1 trainer's extra_info)")
    view = ActorView(engine.module, engine.optimizer, rows, engine, "optimizer_step")
    inputs = UpdateInputs(
        temperature=float(temperature),
        pad_token_id=int(training.model_config.tokenizer.pad_token_id),
        rollout_eval=_field(data, FORECAST_EVAL_META_KEY),
        eval_prompts=lambda: eval_prompts(prompts_by_uid(data), settings.eval_uids),
        response_width=int(rollout.response_length),
    )
    eos = eos_token_ids(training.model_config.generation_config, training.model_config.tokenizer)
    return ForecastRun(view, inputs, settings, state, int(rollout.n), eos)
