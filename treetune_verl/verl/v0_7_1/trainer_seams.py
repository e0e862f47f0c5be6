# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every treetune hook in verl 0.7.1's trainer process: one wrapper per seam, the features it runs in order.

The manager (``verl/v0_7_1/entropy_manager.py``) is built inside the trainer's process before ``fit`` runs, so it
installs these there (:func:`install`, through ``trainer_setup.py``, with the run's :class:`RunFeatures` read from the
trainer's own config). Each seam is one attribute wrapped through ``treetune_verl.patching`` (idempotent, guarded by
verl's version and the exact signature; ``ray_trainer.py`` of verl 0.7.1):

==============================================  =================================================================
seam                                            what runs after verl's own, in order
==============================================  =================================================================
``RayPPOTrainer.fit`` (``:1230``)               1. carry-over, *before* verl's own: the training dataloader
                                                   drawn only when the backlog cannot fill a step
                                                   (``agent_loop/carry_over.py`` ``BoundedLoader``)
``RayPPOTrainer._get_gen_batch`` (``:478``)     1. carry-over, *before* verl's own and in training batches only:
                                                   carried groups and waiting prompts take their slots
                                                   (``agent_loop/carry_over.py`` ``CarryOver.fill_slots``)
``RayPPOTrainer._validate`` (``:502``)          0. marks its batches as validation (for the seam above)
``RayPPOTrainer._save_checkpoint`` (``:854``)   1. carry-over, *before* verl's own: the carried groups and the
                                                   backlog into ``global_step_<k>/treetune_carry_over.pt``
``RayPPOTrainer._load_checkpoint`` (``:923``)   1. carry-over: restores them from the checkpoint verl loaded
``RayPPOTrainer._compute_old_log_prob``         1. rollout entropy: ``rollout_entropy/actor_abs_diff/{mean,max}``
                                                   against the actor's ``entropys`` (carried-over tokens left out) (popped by ``fit`` right after,
                                                   ``ray_trainer.py:1404-1419``), when both describe one distribution
                                                2. the sampled support (entropy mode ``support``):
                                                   ``rollout_support/*`` (sizes, kept mass, the importance ratio)
``ray_trainer.extract_reward`` (``:1386``)      1. over-sampling: reward 0 for rows marked ``rollout_aborted``
``ray_trainer.compute_advantage`` (``:1487``)   1. steering: entropy-shaped advantage, then the forking-token mask
                                                   (``ppo/entropy_advantage.py``: one threshold for the whole batch)
``ray_trainer.compute_data_metrics``            1. the metrics the seams above left in ``batch.meta_info``;
(``:1578``)                                     2. over-sampling: ``rollout/score/...`` (the counts: the manager's)
``RayPPOTrainer._val_metrics_update`` (end of   1. rollout entropy: ``val-aux/rollout_entropy/...`` of the
``_validate``, ``:625``)                           validation rollouts the manager kept
``ray_trainer.compute_timing_metrics``          1. every feature's cost this step: the step's wait on our
(``:1589``, after the step)                        code and our CPU seconds (``timing_s/treetune/*``,
                                                   ``cpu_s/treetune/*``, ``treetune/share_of_step``,
                                                   ``treetune_verl/timing.py``)
==============================================  =================================================================

Each step above runs inside ``timing.SECONDS.timed(<its feature>)``: the agreement, validation and pending metrics
count as ``trainer_hooks``, the reward and metrics of aborted rows as ``over_sampling``, the advantages as
``steering``.

Module-level functions (``extract_reward``, ``compute_advantage``, ``compute_data_metrics``,
``compute_timing_metrics``) are wrapped where
``fit`` looks them up: as globals of ``ray_trainer``.
"""

from __future__ import annotations

import logging
import os
from contextvars import ContextVar
from typing import Any

import torch

from treetune_verl.agent_loop.carry_over import BoundedLoader, CarryOver
from treetune_verl.batch_keys import (
    HAS_ROLLOUT_ENTROPY_KEY,
    PENDING_METRICS_KEY,
    RESPONSE_SUPPORT_KEY,
    ROLLOUT_ABORTED_KEY,
    ROLLOUT_ENTROPY_KEY,
    ROLLOUT_RESUMED_TOKENS_KEY,
)
from treetune_verl.patching import Wrap
from treetune_verl.ppo.entropy_advantage import steer_advantages
from treetune_verl.rollout.rollout_config import entropy_config
from treetune_verl.timing import OVER_SAMPLING, SECONDS, STEERING, TRAINER_HOOKS, step_metrics
from treetune_verl.trainer.features import RunFeatures
from treetune_verl.trainer.metrics import (
    ABORTED_ROWS_METRIC,
    actor_agreement_metrics,
    agreement_is_defined,
    score_metrics,
    support_metrics,
)
from treetune_verl.verl_guard import VERL

__all__ = ["install"]

ACTOR_ENTROPY_KEY = "entropys"  # verl's name for the actor's per-token entropy in _compute_old_log_prob's result

# Signatures the wrappers repeat: verl 0.7.1 trainer/ppo/ray_trainer.py.
_COMPUTE_OLD_LOG_PROB_PARAMS = ("self", "batch")
_COMPUTE_DATA_METRICS_PARAMS = ("batch", "use_critic")
_VAL_METRICS_UPDATE_PARAMS = ("self", "data_sources", "sample_uids", "reward_extra_infos_dict", "sample_turns")
_EXTRACT_REWARD_PARAMS = ("batch",)
_COMPUTE_ADVANTAGE_PARAMS = ("data", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config")
_COMPUTE_TIMING_METRICS_PARAMS = ("batch", "timing_raw")
_GET_GEN_BATCH_PARAMS = ("self", "batch")
_CHECKPOINT_PARAMS = ("self",)
_FIT_PARAMS = ("self",)
CARRY_OVER_STATE_FILE = "treetune_carry_over.pt"  # in verl's global_step_<k> folder, next to its data.pt
_VALIDATE_PARAMS = ("self", "merged")

_VALIDATING: ContextVar[bool] = ContextVar("treetune_validating", default=False)

logger = logging.getLogger(__name__)

# The run's features, from the trainer's config, and carry-over's buffer (install: created by trainer_setup, which
# hands the same buffer to the manager); a process trains one run.
_FEATURES = RunFeatures()
_CARRY_OVER: CarryOver | None = None


def _pending(batch: Any) -> dict[str, float]:
    """The metrics a seam leaves for this step's ``compute_data_metrics``."""
    return batch.meta_info.setdefault(PENDING_METRICS_KEY, {})


def _wrap_compute_old_log_prob(original):
    def _compute_old_log_prob(self, batch):
        old_log_prob, mfu = original(self, batch)
        # 1. rollout entropy: agreement with the actor's own entropy of the same tokens
        with SECONDS.timed(TRAINER_HOOKS):
            _agreement(self, batch, old_log_prob)
            # 2. the sampled support (entropy mode "support"): sizes, kept mass, the actor's importance ratio
            if entropy_config(self.config.actor_rollout_ref.rollout).mode == "support":
                _pending(batch).update(_support(batch, old_log_prob))
        return old_log_prob, mfu

    return _compute_old_log_prob


def _support(batch: Any, old_log_prob: Any) -> dict[str, float]:
    """:func:`support_metrics` of the batch's rows (``rollout_log_probs``: the behaviour log-probs the rollout served)."""
    rollout = batch.batch.get("rollout_log_probs", None)
    old = old_log_prob.batch.get("old_log_probs", None)
    if rollout is None or old is None:
        return {}
    supports = batch.non_tensor_batch.get(RESPONSE_SUPPORT_KEY)
    rows = len(batch)
    return support_metrics(
        [None if supports is None else supports[i] for i in range(rows)],
        list(batch.batch["response_mask"].unbind(0)),
        list(old.unbind(0)),
        list(rollout.unbind(0)),
    )


def _agreement(trainer: Any, batch: Any, old_log_prob: Any) -> None:
    """``rollout_entropy/actor_abs_diff/{mean,max}`` into the step's pending metrics, when defined."""
    actor_entropy = old_log_prob.batch.get(ACTOR_ENTROPY_KEY, None)
    rollout_entropy = batch.batch.get(ROLLOUT_ENTROPY_KEY, None)
    if (
        actor_entropy is not None
        and rollout_entropy is not None
        and agreement_is_defined(trainer.config.actor_rollout_ref.rollout)
    ):
        has_entropy = batch.batch.get(HAS_ROLLOUT_ENTROPY_KEY)
        mask = batch.batch["response_mask"]
        resumed = batch.batch.get(ROLLOUT_RESUMED_TOKENS_KEY, None)
        if resumed is not None:  # carry-over: tokens sampled by earlier weights are not this actor's distribution
            positions = torch.arange(mask.shape[-1], device=mask.device)
            mask = mask * (positions.unsqueeze(0) >= resumed.unsqueeze(-1)).to(mask.dtype)
        _pending(batch).update(actor_agreement_metrics(rollout_entropy, actor_entropy, mask, has_entropy))


def _wrap_extract_reward(original):
    def extract_reward(batch):
        reward_tensor, reward_extra_infos = original(batch)
        # 1. over-sampling: an aborted row's reward is 0 whoever computed it (a reward function may score an empty
        # response, e.g. a format penalty)
        with SECONDS.timed(OVER_SAMPLING):
            aborted = batch.batch.get(ROLLOUT_ABORTED_KEY, None)
            if aborted is not None and bool(aborted.any()):
                reward_tensor = reward_tensor.masked_fill(aborted.bool().unsqueeze(-1), 0.0)
        return reward_tensor, reward_extra_infos

    return extract_reward


def _wrap_compute_advantage(original):
    def compute_advantage(
        data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1, norm_adv_by_std_in_grpo=True, config=None
    ):
        data = original(data, adv_estimator, gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config)
        # 1. steering: advantages reshaped from rollout_entropy (no extra forward pass)
        if _FEATURES.steering.active:
            with SECONDS.timed(STEERING):
                _pending(data).update(steer_advantages(data, _FEATURES.steering))
        return data

    return compute_advantage


def _wrap_compute_data_metrics(original):
    def compute_data_metrics(batch, use_critic=True):
        metrics = original(batch, use_critic)
        # 1. what the seams above (and the manager, for the rollout) left for this step
        with SECONDS.timed(TRAINER_HOOKS):
            metrics.update(batch.meta_info.pop(PENDING_METRICS_KEY, {}))
        # 2. over-sampling (failed rows aborted): the step's reward with and without its aborted rows (the dropped
        #    ones: the manager's count, in the pending metrics above; a carried group's rows are not aborted)
        if _FEATURES.aborts_rows:
            with SECONDS.timed(OVER_SAMPLING):
                kept = ~batch.batch[ROLLOUT_ABORTED_KEY].bool()
                scores = batch.batch["token_level_scores"].sum(-1)[kept]
                completed = float(scores.double().mean()) if len(scores) else None
                aborted = int(metrics.get(ABORTED_ROWS_METRIC, (~kept).sum()))
                metrics.update(score_metrics(completed, len(scores), aborted))
        return metrics

    return compute_data_metrics


def _wrap_compute_timing_metrics(original):
    def compute_timing_metrics(batch, timing_raw):
        metrics = original(batch, timing_raw)
        # 1. every feature's seconds in our code since the last step's (timing.py)
        metrics.update(step_metrics(SECONDS.take(), timing_raw.get("step")))
        return metrics

    return compute_timing_metrics


def _wrap_fit(original):
    def fit(self):
        # 1. carry-over: the dataloader drawn only when the backlog cannot fill a step (a bounded backlog)
        if _CARRY_OVER is not None and not isinstance(self.train_dataloader, BoundedLoader):
            self.train_dataloader = BoundedLoader(self.train_dataloader, _CARRY_OVER)
        return original(self)

    return fit


def _wrap_get_gen_batch(original):
    def _get_gen_batch(self, batch):
        # 1. carry-over: the groups carried from the last step and the prompts they displaced take their slots
        carry_over = _CARRY_OVER
        if carry_over is not None and not _VALIDATING.get():
            if not isinstance(self.train_dataloader, BoundedLoader):
                raise RuntimeError(
                    f"carry-over: the trainer's dataloader is {type(self.train_dataloader).__qualname__}, not "
                    "carry_over.BoundedLoader: a fit other than RayPPOTrainer.fit (whose seam installs it) would let "
                    "the prompt backlog grow by the carried groups at every step"
                )
            with SECONDS.timed(OVER_SAMPLING):
                carry_over.fill_slots(batch, self.global_steps)
        return original(self, batch)

    return _get_gen_batch


def _step_folder(trainer: Any, loading: bool = False) -> str:
    """verl's checkpoint folder of the trainer's ``global_steps``: where ``_save_checkpoint`` writes, or the one
    ``_load_checkpoint`` read (``trainer.resume_from_path`` in ``resume_mode=resume_path``)."""
    config = trainer.config.trainer
    if loading and config.resume_mode == "resume_path":
        return os.path.abspath(config.resume_from_path)
    return os.path.join(os.path.abspath(config.default_local_dir), f"global_step_{trainer.global_steps}")


def _wrap_save_checkpoint(original):
    def _save_checkpoint(self):
        # 1. carry-over: its groups and backlog, written before verl marks the checkpoint as the latest
        carry_over = _CARRY_OVER
        if carry_over is not None:
            with SECONDS.timed(OVER_SAMPLING):
                folder = _step_folder(self)
                os.makedirs(folder, exist_ok=True)
                torch.save(carry_over.state_dict(), os.path.join(folder, CARRY_OVER_STATE_FILE))
        return original(self)

    return _save_checkpoint


def _wrap_load_checkpoint(original):
    def _load_checkpoint(self):
        result = original(self)
        # 1. carry-over: restored from the checkpoint verl just loaded (global_steps > 0), if it has one
        carry_over = _CARRY_OVER
        if carry_over is not None and self.global_steps > 0:
            path = os.path.join(_step_folder(self, loading=True), CARRY_OVER_STATE_FILE)
            if os.path.exists(path):
                carry_over.load_state_dict(torch.load(path, weights_only=False))
            else:
                logger.warning("carry-over: %s not found (saved without carry-over?): nothing carried over", path)
        return result

    return _load_checkpoint


def _wrap_validate(original):
    def _validate(self, merged=False):
        token = _VALIDATING.set(True)
        try:
            return original(self, merged)
        finally:
            _VALIDATING.reset(token)

    return _validate


def _wrap_val_metrics_update(original):
    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns):
        metrics = original(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns)
        # 1. rollout entropy of the validation rollouts (verl's _validate drops the generation's meta_info["timing"])
        take = getattr(self.async_rollout_manager, "take_validation_metrics", None)
        if take is not None:
            with SECONDS.timed(TRAINER_HOOKS):
                metrics.update({f"val-aux/{key.removeprefix('agent_loop/')}": value for key, value in take().items()})
        return metrics

    return _val_metrics_update


def install(features: RunFeatures, carry_over: CarryOver | None = None) -> None:
    """Install the seams in this process (idempotent) and run them with ``features`` and carry-over's buffer (the
    latest call's; ``None`` without carry-over).

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    global _FEATURES, _CARRY_OVER
    from verl.trainer.ppo import ray_trainer

    VERL.require("trainer hooks")
    trainer = ray_trainer.RayPPOTrainer
    VERL.wrap(
        Wrap(trainer, "fit", _wrap_fit, _FIT_PARAMS),
        Wrap(trainer, "_get_gen_batch", _wrap_get_gen_batch, _GET_GEN_BATCH_PARAMS),
        Wrap(trainer, "_validate", _wrap_validate, _VALIDATE_PARAMS),
        Wrap(trainer, "_save_checkpoint", _wrap_save_checkpoint, _CHECKPOINT_PARAMS),
        Wrap(trainer, "_load_checkpoint", _wrap_load_checkpoint, _CHECKPOINT_PARAMS),
        Wrap(trainer, "_compute_old_log_prob", _wrap_compute_old_log_prob, _COMPUTE_OLD_LOG_PROB_PARAMS),
        Wrap(ray_trainer, "extract_reward", _wrap_extract_reward, _EXTRACT_REWARD_PARAMS),
        Wrap(ray_trainer, "compute_advantage", _wrap_compute_advantage, _COMPUTE_ADVANTAGE_PARAMS),
        Wrap(ray_trainer, "compute_data_metrics", _wrap_compute_data_metrics, _COMPUTE_DATA_METRICS_PARAMS),
        Wrap(trainer, "_val_metrics_update", _wrap_val_metrics_update, _VAL_METRICS_UPDATE_PARAMS),
        Wrap(ray_trainer, "compute_timing_metrics", _wrap_compute_timing_metrics, _COMPUTE_TIMING_METRICS_PARAMS),
    )
    _FEATURES, _CARRY_OVER = features, carry_over
