# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Guarded patch of verl 0.7.1's legacy FSDP actor worker: the forecast around every k-th actor update.

Seam: ``verl/workers/fsdp_workers.py`` ``ActorRolloutRefWorker.update_actor(self, data)``, the worker method the
trainer calls once per step (Ray resolves it on the instance at call time: ``single_controller/ray/base.py``
``_bind_workers_method_to_parent``, so replacing the class attribute in the worker process takes effect). The
worker, unlike ``DataParallelPPOActor``, holds the whole ``actor_rollout_ref`` config, where the forecast's settings
live (``rollout.custom.entropy_forecast``, ``settings.py``). On a probed call the worker's actor gets an instance
attribute ``update_policy`` for the duration of the call, which runs verl's (class) ``update_policy`` through
``live.forecast_update`` and adds the ``probe/*`` and ``timing_s/probe`` metrics to the dict it returns, so they reach
the trainer's ``metrics.jsonl`` with verl's own actor metrics. The parameters are then where verl's update put
them (also with parameter offload, which ``update_actor`` undoes only after ``update_policy``).

Steps are counted per worker process: calls 1, 1 + every, 1 + 2·every... of ``update_actor`` (a resumed run counts
from its first step again). Not handled: the new worker implementation (``trainer.use_legacy_worker_impl=disable``,
refused by ``treetune_verl.ppo.actor_setup``), Megatron.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from treetune_verl.forecast.live import ForecastState, forecast_update
from treetune_verl.forecast.settings import forecast_settings
from treetune_verl.patching import original_of, replace_attr
from treetune_verl.verl_guard import check_signature, require_verl, undecorated

UPDATE_ACTOR_PARAMS = ("self", "data")
UPDATE_POLICY_PARAMS = ("self", "data")
_STATE_ATTR = "_treetune_entropy_forecast"


def _wrap_update_actor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)  # keeps verl's @register attributes
    def update_actor(self, data):
        settings = forecast_settings(self.config.rollout)
        if settings is None:
            return original(self, data)
        state = vars(self).setdefault(_STATE_ATTR, ForecastState())
        state.calls += 1
        if (state.calls - 1) % settings.every != 0:
            return original(self, data)
        actor = self.actor
        rollout_n = int(self.config.rollout.n)
        data.meta_info.setdefault("pad_token_id", self.tokenizer.pad_token_id)  # as update_actor does
        eos = getattr(getattr(self, "generation_config", None), "eos_token_id", None)
        eos = self.tokenizer.eos_token_id if eos is None else eos
        eos_token_ids = list(eos) if isinstance(eos, list | tuple) else [eos]

        def update_policy(data):
            metrics, probe_metrics = forecast_update(
                actor, data, settings, state, rollout_n, eos_token_ids, lambda: type(actor).update_policy(actor, data)
            )
            metrics.update(probe_metrics)
            return metrics

        actor.update_policy = update_policy
        try:
            return original(self, data)
        finally:
            del actor.update_policy

    return update_actor


def install() -> None:
    """Install the patch in this process (idempotent); a worker does it by importing ``forecast.actor_setup``.

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped method.
    """
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    require_verl("entropy forecast")
    check_signature(
        original_of(ActorRolloutRefWorker.update_actor), UPDATE_ACTOR_PARAMS, "ActorRolloutRefWorker.update_actor"
    )
    check_signature(
        undecorated(original_of(DataParallelPPOActor.update_policy)),
        UPDATE_POLICY_PARAMS,
        "DataParallelPPOActor.update_policy",
    )
    replace_attr(ActorRolloutRefWorker, "update_actor", _wrap_update_actor)
