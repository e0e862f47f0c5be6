# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Hooks on verl 0.7.1's ``RayPPOTrainer`` that log what only the trainer sees, installed by the manager.

The manager (``entropy_manager.py``) is built inside the trainer's process before ``fit`` runs, so it installs
these one-attribute patches there (idempotent, guarded by verl's version and the exact signatures):

- ``RayPPOTrainer._compute_old_log_prob``: the actor's per-token entropy of the sampled tokens exists only in its
  result (``entropys``, popped by ``fit`` right after ``actor/entropy`` is computed, ``ray_trainer.py:1404-1419``).
  The wrapper compares it with ``batch["rollout_entropy"]`` and leaves ``rollout_entropy/actor_abs_diff/{mean,max}``
  in ``batch.meta_info`` (when the two describe the same distribution: see :func:`agreement_is_defined`).
- ``ray_trainer.compute_data_metrics`` (looked up as a module global by ``fit``, ``ray_trainer.py:1578``): returns
  verl's metrics plus those left in ``batch.meta_info``, so they reach every logger with the step's metrics.
- ``RayPPOTrainer._val_metrics_update`` (end of ``_validate``, ``ray_trainer.py:625``): adds the rollout-entropy
  metrics of the validation rollouts, which the manager collected, as ``val-aux/rollout_entropy/...``; verl's
  validation drops the generation output's ``meta_info["timing"]``.
- ``ray_trainer.extract_reward`` (``ray_trainer.py:1386``, imported by name from ``trainer/ppo/reward.py``): the
  reward of a row marked ``rollout_aborted`` becomes 0 whoever computed it (the reward function may score an empty
  response, e.g. a format penalty). The compute_data_metrics wrapper also adds the over-sampling metrics
  (``metrics.over_sample_metrics``) when the batch carries ``rollout_aborted``.
- ``ray_trainer.compute_advantage`` (``ray_trainer.py:1487``, a module global of ``fit``): when the manager put
  entropy steering into the batch (``custom.entropy.pg_token_quantile`` / ``advantage_shaping``), the advantages
  verl computed are reshaped from ``rollout_entropy`` (:func:`steer_advantages`): no extra forward pass, one
  threshold for the whole training batch.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.agent_loop.fields import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ABORTED_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.agent_loop.metrics import actor_agreement_metrics, over_sample_metrics
from treetune_verl.patching import replace_attr
from treetune_verl.ppo.entropy_advantage import entropy_shaped_advantages, forking_token_mask, mask_advantages
from treetune_verl.rollout.rollout_config import entropy_config
from treetune_verl.verl_guard import SUPPORTED_VERL_VERSIONS, UnsupportedVerlError, check_signature, require_verl

__all__ = ["SUPPORTED_VERL_VERSIONS", "UnsupportedVerlError", "agreement_is_defined", "install_trainer_hooks"]

PENDING_METRICS_KEY = "treetune_step_metrics"  # batch.meta_info: metrics to add to this step's data metrics
STEERING_META_KEY = "treetune_entropy_steering"  # batch.meta_info: EntropySteering as a dict, set by the manager
ACTOR_ENTROPY_KEY = "entropys"  # verl's name for the actor's per-token entropy in _compute_old_log_prob's result

# Signatures the wrappers repeat: verl 0.7.1 trainer/ppo/ray_trainer.py.
_COMPUTE_OLD_LOG_PROB_PARAMS = ("self", "batch")
_COMPUTE_DATA_METRICS_PARAMS = ("batch", "use_critic")
_VAL_METRICS_UPDATE_PARAMS = ("self", "data_sources", "sample_uids", "reward_extra_infos_dict", "sample_turns")
_EXTRACT_REWARD_PARAMS = ("batch",)
_COMPUTE_ADVANTAGE_PARAMS = ("data", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config")


def agreement_is_defined(rollout_config: Any) -> bool:
    """Whether rollout entropy and the actor's entropy describe the same distribution.

    verl's actor computes the entropy of softmax(logits / T) over the full vocabulary at the rollout temperature T
    (``dp_actor.py`` ``_forward_micro_batch``): ``tempered`` mode, or ``raw`` mode at T = 1, without top-k.
    """
    config = entropy_config(rollout_config)
    temperature = float(rollout_config.get("temperature", 1.0))
    return config.top_k is None and (config.mode == "tempered" or temperature == 1.0)


def _wrap_compute_old_log_prob(original):
    def _compute_old_log_prob(self, batch):
        old_log_prob, mfu = original(self, batch)
        actor_entropy = old_log_prob.batch.get(ACTOR_ENTROPY_KEY, None)
        rollout_entropy = batch.batch.get(ROLLOUT_ENTROPY_KEY, None)
        if (
            actor_entropy is not None
            and rollout_entropy is not None
            and agreement_is_defined(self.config.actor_rollout_ref.rollout)
        ):
            metrics = actor_agreement_metrics(
                rollout_entropy, actor_entropy, batch.batch["response_mask"], batch.batch.get(HAS_ROLLOUT_ENTROPY_KEY)
            )
            batch.meta_info.setdefault(PENDING_METRICS_KEY, {}).update(metrics)
        return old_log_prob, mfu

    return _compute_old_log_prob


def _wrap_compute_data_metrics(original):
    def compute_data_metrics(batch, use_critic=True):
        metrics = original(batch, use_critic)
        metrics.update(batch.meta_info.pop(PENDING_METRICS_KEY, {}))
        aborted = batch.batch.get(ROLLOUT_ABORTED_KEY, None)
        if aborted is not None:
            metrics.update(over_sample_metrics(aborted, batch.batch["token_level_scores"].sum(-1)))
        return metrics

    return compute_data_metrics


def _wrap_val_metrics_update(original):
    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns):
        metrics = original(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns)
        take = getattr(self.async_rollout_manager, "take_validation_metrics", None)
        if take is not None:
            metrics.update({f"val-aux/{key.removeprefix('agent_loop/')}": value for key, value in take().items()})
        return metrics

    return _val_metrics_update


def _wrap_extract_reward(original):
    def extract_reward(batch):
        reward_tensor, reward_extra_infos = original(batch)
        aborted = batch.batch.get(ROLLOUT_ABORTED_KEY, None)
        if aborted is not None and bool(aborted.any()):
            reward_tensor = reward_tensor.masked_fill(aborted.bool().unsqueeze(-1), 0.0)
        return reward_tensor, reward_extra_infos

    return extract_reward


def steer_advantages(batch: Any, steering: dict[str, Any]) -> dict[str, float]:
    """Reshape ``batch.batch["advantages"]`` in place from ``rollout_entropy``; returns the step's metrics.

    Entropy shaping first (``entropy_advantage/{bonus_mean,capped_share}``), then the forking-token mask
    (``pg_token_mask/{threshold,kept_share,entropy_kept_mean,entropy_dropped_mean}``), both over the
    ``response_mask`` tokens of the whole training batch.

    Raises:
        ValueError: the batch has no ``rollout_entropy``, or rows whose loop carries none (their zeros are not
            entropies: they would all be dropped as the least uncertain tokens).
    """
    tensors = batch.batch
    entropy = tensors.get(ROLLOUT_ENTROPY_KEY, None)
    if entropy is None:
        raise ValueError(f"entropy steering needs batch[{ROLLOUT_ENTROPY_KEY!r}]: is the override block on?")
    has_entropy = tensors.get(HAS_ROLLOUT_ENTROPY_KEY, None)
    if has_entropy is not None and not bool(has_entropy.all()):
        rows = (~has_entropy.bool()).nonzero().flatten().tolist()
        raise ValueError(
            f"entropy steering: rows {rows[:10]} carry no rollout entropy (stock verl agent loops?); use the entropy "
            "loops for every row (README, 'Rollout entropy in verl')"
        )
    mask, advantages, metrics = tensors["response_mask"], tensors["advantages"], {}
    if steering.get("shaping_alpha") is not None:
        advantages, shaping = entropy_shaped_advantages(
            advantages, entropy, mask, steering["shaping_alpha"], steering["shaping_kappa"]
        )
        metrics |= {f"entropy_advantage/{key}": value for key, value in shaping.items()}
    if steering.get("pg_token_quantile") is not None:
        keep, forking = forking_token_mask(entropy, mask, steering["pg_token_quantile"])
        advantages = mask_advantages(advantages, keep, mask)
        metrics |= {f"pg_token_mask/{key}": value for key, value in forking.items()}
    tensors["advantages"] = advantages
    return metrics


def _wrap_compute_advantage(original):
    def compute_advantage(
        data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1, norm_adv_by_std_in_grpo=True, config=None
    ):
        data = original(data, adv_estimator, gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config)
        steering = data.meta_info.get(STEERING_META_KEY)
        if steering:
            data.meta_info.setdefault(PENDING_METRICS_KEY, {}).update(steer_advantages(data, steering))
        return data

    return compute_advantage


def install_trainer_hooks() -> None:
    """Install the hooks in this process (idempotent).

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    from verl.trainer.ppo import ray_trainer

    require_verl("trainer hooks")
    trainer = ray_trainer.RayPPOTrainer
    check_signature(trainer._compute_old_log_prob, _COMPUTE_OLD_LOG_PROB_PARAMS, "RayPPOTrainer._compute_old_log_prob")
    check_signature(ray_trainer.compute_data_metrics, _COMPUTE_DATA_METRICS_PARAMS, "ray_trainer.compute_data_metrics")
    check_signature(trainer._val_metrics_update, _VAL_METRICS_UPDATE_PARAMS, "RayPPOTrainer._val_metrics_update")
    check_signature(ray_trainer.extract_reward, _EXTRACT_REWARD_PARAMS, "ray_trainer.extract_reward")
    check_signature(ray_trainer.compute_advantage, _COMPUTE_ADVANTAGE_PARAMS, "ray_trainer.compute_advantage")
    replace_attr(trainer, "_compute_old_log_prob", _wrap_compute_old_log_prob)
    replace_attr(ray_trainer, "compute_data_metrics", _wrap_compute_data_metrics)
    replace_attr(trainer, "_val_metrics_update", _wrap_val_metrics_update)
    replace_attr(ray_trainer, "extract_reward", _wrap_extract_reward)
    replace_attr(ray_trainer, "compute_advantage", _wrap_compute_advantage)
