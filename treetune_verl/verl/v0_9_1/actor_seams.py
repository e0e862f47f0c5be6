# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every treetune hook in verl 0.9.1's engine-worker actor: one wrapper per seam, the features it runs in order.

Installed by importing ``treetune_verl.verl.process_setup`` (verl imports ``actor_rollout_ref.model.external_lib``
wherever it builds the model config: the engine workers, the agent-loop workers, the trainer's process; only the
engine worker calls the seam). Wrapped through ``treetune_verl.patching`` (idempotent, guarded by verl's version and
the exact signature); verl 0.7.1's actor seams are ``treetune_verl/verl/v0_7_1/actor_seams.py``.

=====================================================  ============================================================
seam (verl 0.9.1)                                      what runs, in order
=====================================================  ============================================================
``engine_workers.ActorRolloutRefWorker.update_actor``  1. forecast (``rollout.custom.entropy_forecast``): on the
(once per step, every rank; ``engine_workers.py:713``;    steps the rollout sampled E for (the batch's
its rows reach ``actor.train_mini_batch``, set on the     ``FORECAST_EVAL_META_KEY`` not None), else every k-th call,
instance for the call)
                                                          E taken or sampled at θ, ΔH₁ of the update's first
                                                          optimizer step (``engine.optimizer_step``, routed through
                                                          ``ForecastRun``) and the realised change; ``probe/*`` and
                                                          ``timing_s/probe`` join verl's actor metrics on the rank
                                                          that returns them (verl's trainer prefixes them
                                                          ``actor/``: its seam names them back,
                                                          ``trainer_seams.py``)
``engine/fsdp/transformer_impl.FSDPEngineWithLMHead``    1. support replay (``support_replay.py``): the logits of
``.prepare_model_outputs`` (every forward of the old-log-     each response token whose row carries
prob pass, the update and the reference model)               ``extra_fields["response_support"]`` masked outside its
                                                          sampled support, before verl's temperature and log-softmax
=====================================================  ============================================================
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY
from treetune_verl.control.controller import attach as attach_controller
from treetune_verl.forecast.live import counted_call
from treetune_verl.patching import Wrap, swapped
from treetune_verl.verl.v0_9_1 import support_replay
from treetune_verl.verl.v0_9_1.engine_forecast import engine_forecast
from treetune_verl.verl_guard import VERL_CURRENT

__all__ = ["install"]

# Signature the wrapper repeats: verl 0.9.1 workers/engine_workers.py ActorRolloutRefWorker.update_actor.
UPDATE_ACTOR_PARAMS = ("self", "data")


def _wrap_update_actor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)  # keeps verl's @register attributes (the dispatch over ranks)
    def update_actor(self, data):
        # 1. forecast. Here ``data`` is what the trainer sent (a TransferQueue ``KVBatchMeta`` in the V1 trainer);
        # verl's decorators fetch the rows, so the forecast starts in the actor's train_mini_batch(TensorDict), set
        # on the instance for this call.
        counted = counted_call(self)
        if counted is None:
            return original(self, data)
        settings, state = counted
        attach_controller(self, state)  # custom.entropy_control: decides inside the forecast's first step
        training = self.actor
        train_mini_batch = training.train_mini_batch

        def forecast_train_mini_batch(data):
            from verl.utils import tensordict_utils as tu

            marked = FORECAST_EVAL_META_KEY in data
            if not state.due(settings.every, marked, tu.get(data, FORECAST_EVAL_META_KEY, default=None)):
                return train_mini_batch(data=data)
            forecast = engine_forecast(self, data, settings, state)
            output, metrics = forecast.around(lambda: train_mini_batch(data=data))  # finish() on every rank
            if output is not None:  # the rank that returns verl's metrics
                tu.get(output, "metrics").update(metrics)
            return output

        with swapped(training, "train_mini_batch", forecast_train_mini_batch):
            return original(self, data)

    return update_actor


def install() -> None:
    """Install the engine-worker actor seams in this process (idempotent).

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    from verl.workers.engine_workers import ActorRolloutRefWorker

    VERL_CURRENT.require("engine-worker actor hooks")
    VERL_CURRENT.wrap(Wrap(ActorRolloutRefWorker, "update_actor", _wrap_update_actor, UPDATE_ACTOR_PARAMS))
    support_replay.install()  # the engine's logits over the sampled support (entropy mode "support")
