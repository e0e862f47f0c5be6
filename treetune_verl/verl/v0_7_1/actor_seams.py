# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every treetune hook in verl 0.7.1's actor workers: one wrapper per seam, the features it runs in order.

Installed by importing ``treetune_verl.verl.process_setup`` (verl imports ``actor_rollout_ref.model.external_lib``
in each worker's ``init_model``). Each seam is wrapped through ``treetune_verl.patching`` (idempotent, guarded by
verl's version and the exact signature). Every feature is inert unless its data or settings are there: aborted rows
in the batch (over-sampling), ``rollout.custom.entropy_forecast`` in the worker's config (the forecast).

=====================================================  ============================================================
seam (verl 0.7.1)                                      what runs, in order
=====================================================  ============================================================
``fsdp_workers.ActorRolloutRefWorker.update_actor``    1. forecast: on the steps the rollout sampled E for (else on
(once per step; Ray resolves it on the instance at        every k-th call), asks the actor's next ``update_policy``
call time, ``single_controller/ray/base.py``)             for a forecast (the worker holds the ``actor_rollout_ref``
                                                          config, where its settings live)
``dp_actor.DataParallelPPOActor.update_policy``        0. support replay: the rows' supports kept by verl's ``select``
                                                          (``support_replay.py``);
                                                       1. over-sampling: the loss over completed rows
                                                          (``ppo/loss_aggregation.py``: counts over the ranks);
                                                       2. forecast: E at θ (the rollout's, or sampled here:
                                                          ``forecast/live.py``), its
                                                          ``probe/*`` metrics added to verl's actor metrics
``DataParallelPPOActor.compute_log_prob``              1. support replay: the rows' supports kept by verl's ``select``
``DataParallelPPOActor._forward_micro_batch``          1. support replay: the logits masked outside each response
                                                          token's sampled support (a forward hook for the call)
``DataParallelPPOActor._optimizer_step`` (set on the   1. over-sampling: the next mini-batch's counts after each step;
instance for one ``update_policy``)                    2. forecast: ΔH₁ at the first step (verl's step inside it)
``core_algos.agg_loss``, ``dp_actor.agg_loss``         1. over-sampling: verl's aggregation over the mini-batch's
                                                          completed rows inside ``update_policy``; 0, not NaN, for a
                                                          zero denominator anywhere
``rollout_corr_helper.compute_rollout_corr_``          1. over-sampling: no metric for a micro-batch of aborted rows
``metrics_from_logprobs``                                 (verl asserts a valid token, ``rollout_corr_helper.py:870``,
                                                          called per micro-batch by ``dp_actor.py:631``)
=====================================================  ============================================================

Not handled: the new worker implementation (``trainer.use_legacy_worker_impl=disable``, refused by ``process_setup``),
Megatron.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY
from treetune_verl.control.controller import attach as attach_controller
from treetune_verl.forecast.live import ForecastRun, counted_call, eos_token_ids
from treetune_verl.patching import Wrap, swapped
from treetune_verl.ppo import loss_aggregation
from treetune_verl.ppo.loss_aggregation import MiniBatchNormalisation, normalisation_for
from treetune_verl.verl.v0_7_1.support_replay import (
    COMPUTE_LOG_PROB_PARAMS,
    FORWARD_MICRO_BATCH_PARAMS,
    keeping_supports,
    wrap_compute_log_prob,
    wrap_forward_micro_batch,
)
from treetune_verl.verl_guard import VERL, undecorated

__all__ = ["install"]

# Signatures the wrappers repeat: verl 0.7.1 trainer/ppo/core_algos.py, workers/actor/dp_actor.py,
# workers/fsdp_workers.py, trainer/ppo/rollout_corr_helper.py.
AGG_LOSS_PARAMS = (
    "loss_mat",
    "loss_mask",
    "loss_agg_mode",
    "dp_size",
    "batch_num_tokens",
    "global_batch_size",
    "loss_scale_factor",
)
UPDATE_POLICY_PARAMS = ("self", "data")
UPDATE_ACTOR_PARAMS = ("self", "data")
ROLLOUT_CORR_METRICS_PARAMS = ("log_prob", "rollout_log_prob", "response_mask")

_FORECAST_REQUEST_ATTR = "_treetune_forecast_request"  # on the actor, for one update_policy call

# The normalisation of the update_policy call running in this process (None outside one, or without aborted rows).
_ACTIVE_NORMALISATION: MiniBatchNormalisation | None = None


def _wrap_update_actor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)  # keeps verl's @register attributes
    def update_actor(self, data):
        # 1. forecast: on the steps our rollout manager sampled E for (the key present, its value not None), else
        # every k-th call of this worker (1, 1 + k, ...; a resumed run counts from its first step again)
        counted = counted_call(self)
        if counted is None:
            return original(self, data)
        settings, state = counted
        attach_controller(self, state)  # custom.entropy_control: decides inside the forecast's first step
        marked = FORECAST_EVAL_META_KEY in data.meta_info
        if not state.due(settings.every, marked, data.meta_info.get(FORECAST_EVAL_META_KEY)):
            return original(self, data)
        data.meta_info.setdefault("pad_token_id", self.tokenizer.pad_token_id)  # as update_actor does
        eos = eos_token_ids(getattr(self, "generation_config", None), self.tokenizer)
        request = (settings, state, int(self.config.rollout.n), eos)
        with swapped(self.actor, _FORECAST_REQUEST_ATTR, request):
            return original(self, data)

    return update_actor


def _chain(handlers: list[Callable[[Callable[[], Any]], Any]], step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` wrapped by ``handlers``, the first outermost: each gets the next as its argument."""
    for handler in reversed(handlers):
        step = functools.partial(handler, step)
    return step


def _wrap_update_policy(original: Callable[..., Any]) -> Callable[..., Any]:
    def update_policy(self, data):
        with keeping_supports(data):  # support replay: verl's select would drop the rows' supports
            return _update_policy(self, data)

    def _update_policy(self, data):
        global _ACTIVE_NORMALISATION
        # 1. over-sampling: the loss over completed rows when some row of the global batch is aborted
        normalisation = normalisation_for(self, data)
        # 2. forecast, when update_actor asked for it: E sampled now, at θ
        request = vars(self).get(_FORECAST_REQUEST_ATTR)
        forecast = ForecastRun.from_dp_actor(self, data, *request) if request is not None else None
        step_handlers = [h.optimizer_step for h in (normalisation, forecast) if h is not None]
        if not step_handlers:
            return original(self, data)
        previous, _ACTIVE_NORMALISATION = _ACTIVE_NORMALISATION, normalisation
        try:
            with swapped(self, "_optimizer_step", _chain(step_handlers, self._optimizer_step)):
                metrics = original(self, data)
        finally:
            _ACTIVE_NORMALISATION = previous
        if forecast is not None:
            metrics.update(forecast.finish())
        return metrics

    return update_policy


def _wrap_agg_loss(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def agg_loss(
        loss_mat: torch.Tensor,
        loss_mask: torch.Tensor,
        loss_agg_mode: str,
        dp_size: int = 1,
        batch_num_tokens: int | None = None,
        global_batch_size: int | None = None,
        loss_scale_factor: int | None = None,
    ) -> torch.Tensor:
        # 1. over-sampling
        global_args = (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)
        return loss_aggregation.aggregate(
            original, _ACTIVE_NORMALISATION, loss_mat, loss_mask, loss_agg_mode, global_args
        )

    return agg_loss


def _wrap_rollout_corr_metrics(original: Callable[..., dict[str, float]]) -> Callable[..., dict[str, float]]:
    def compute_rollout_corr_metrics_from_logprobs(
        log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
    ) -> dict[str, float]:
        # 1. over-sampling: the per-micro-batch metrics are lists appended to; an empty micro-batch adds nothing
        if not bool(response_mask.any()):
            return {}
        return original(log_prob, rollout_log_prob, response_mask)

    return compute_rollout_corr_metrics_from_logprobs


def install() -> None:
    """Install every actor seam in this process (idempotent; all or none).

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    from verl.trainer.ppo import core_algos, rollout_corr_helper
    from verl.workers.actor import dp_actor
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    VERL.require("actor hooks")
    actor = dp_actor.DataParallelPPOActor
    VERL.wrap(
        Wrap(ActorRolloutRefWorker, "update_actor", _wrap_update_actor, UPDATE_ACTOR_PARAMS),
        Wrap(actor, "update_policy", _wrap_update_policy, UPDATE_POLICY_PARAMS, unwrap=undecorated),
        Wrap(actor, "compute_log_prob", wrap_compute_log_prob, COMPUTE_LOG_PROB_PARAMS, unwrap=undecorated),
        Wrap(actor, "_forward_micro_batch", wrap_forward_micro_batch, FORWARD_MICRO_BATCH_PARAMS),
        Wrap(core_algos, "agg_loss", _wrap_agg_loss, AGG_LOSS_PARAMS, "core_algos.agg_loss"),
        Wrap(dp_actor, "agg_loss", _wrap_agg_loss, AGG_LOSS_PARAMS, "dp_actor.agg_loss"),
        Wrap(
            rollout_corr_helper,
            "compute_rollout_corr_metrics_from_logprobs",
            _wrap_rollout_corr_metrics,
            ROLLOUT_CORR_METRICS_PARAMS,
        ),
    )
    # Not wrapped (set per update_policy call), but the wrappers call it with no argument.
    VERL.check_signature(actor._optimizer_step, ("self",), "DataParallelPPOActor._optimizer_step")
