# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Steering the policy gradient with the rollout entropy the sampler already computed (no extra forward pass).

Two transformations of verl's per-token advantages ``[batch, response_length]``, applied after verl computed them:

- :func:`forking_token_mask` ("Beyond the 80/20 Rule", Wang et al., 2025): keep the policy gradient only at the
  highest-entropy tokens. Of the ``n`` response tokens of the whole training batch (``response_mask``), the
  ``k = ceil(q * n)`` highest rollout entropies are kept: the threshold is the k-th largest entropy, and every token at
  or above it is kept (ties at the threshold are all kept, so the kept share can exceed ``q``; ``q = 1`` keeps every
  token). The advantage of the other tokens becomes 0, which removes their policy-gradient term for every verl policy
  loss whose per-token loss is proportional to the token's advantage (vanilla PPO clip, dual-clip, GPG); the
  normaliser of ``loss_agg_mode`` still counts every response token, as TRL's ``top_entropy_quantile`` does.
- :func:`entropy_shaped_advantages` ("Reasoning with Exploration: An Entropy Perspective", Cheng et al., 2025):
  ``A + min(alpha * H, |A| / kappa)`` at each response token, ``H`` the rollout entropy (nats, detached: it is data).

Entropies come from ``batch["rollout_entropy"]`` (float32 ``[batch, response_length]``, nats). The settings
(:class:`EntropySteering`, ``actor_rollout_ref.rollout.custom.entropy``) are read by the trainer from its own config;
:func:`steer_advantages` applies both to a training batch (called by the ``compute_advantage`` seam,
``treetune_verl/verl/v0_7_1/trainer_seams.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from treetune_verl.batch_keys import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.rollout.rollout_config import CONFIG_PATH, ENTROPY_SECTION, read_key

STEERING_KEYS = ("pg_token_quantile", "advantage_shaping")  # in custom.entropy, beside the sampler's ENTROPY_KEYS
SHAPING_KEYS = ("alpha", "kappa")  # custom.entropy.advantage_shaping


@dataclass(frozen=True)
class EntropySteering:
    """What the trainer does with rollout entropy (``custom.entropy``; all off by default).

    ``pg_token_quantile``: train the policy gradient only on the top ``q`` share of response tokens by rollout
    entropy (``None``: off). ``shaping_alpha`` / ``shaping_kappa``: the entropy-shaped advantage
    ``A + min(alpha * H, |A| / kappa)`` (``shaping_alpha`` ``None``: off). Read by the trainer from its own config (``trainer_seams.py``).
    """

    pg_token_quantile: float | None = None
    shaping_alpha: float | None = None
    shaping_kappa: float = 2.0

    @property
    def active(self) -> bool:
        return self.pg_token_quantile is not None or self.shaping_alpha is not None


def entropy_steering(rollout_config: Any) -> EntropySteering:
    """``EntropySteering`` from ``custom.entropy.{pg_token_quantile, advantage_shaping.{alpha, kappa}}``.

    Raises:
        ValueError: a quantile outside ``(0, 1]``, ``alpha < 0`` or ``kappa <= 1``, naming the key.
    """
    section = read_key(read_key(rollout_config, "custom"), ENTROPY_SECTION) or {}
    where = f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}"
    quantile = read_key(section, "pg_token_quantile")
    if quantile is not None and not 0.0 < float(quantile) <= 1.0:
        raise ValueError(f"{where}.pg_token_quantile must be in (0, 1] or null, got {quantile}")
    shaping = read_key(section, "advantage_shaping") or {}
    alpha, kappa = read_key(shaping, "alpha"), float(read_key(shaping, "kappa", 2.0))
    if alpha is not None and (float(alpha) < 0 or kappa <= 1):
        raise ValueError(f"{where}.advantage_shaping needs alpha >= 0 and kappa > 1, got alpha={alpha}, kappa={kappa}")
    return EntropySteering(
        pg_token_quantile=None if quantile is None else float(quantile),
        shaping_alpha=None if alpha is None else float(alpha),
        shaping_kappa=kappa,
    )


def steer_advantages(batch: Any, steering: EntropySteering) -> dict[str, float]:
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
    if steering.shaping_alpha is not None:
        advantages, shaping = entropy_shaped_advantages(
            advantages, entropy, mask, steering.shaping_alpha, steering.shaping_kappa
        )
        metrics |= {f"entropy_advantage/{key}": value for key, value in shaping.items()}
    if steering.pg_token_quantile is not None:
        keep, forking = forking_token_mask(entropy, mask, steering.pg_token_quantile)
        advantages = mask_advantages(advantages, keep, mask)
        metrics |= {f"pg_token_mask/{key}": value for key, value in forking.items()}
    tensors["advantages"] = advantages
    return metrics


def forking_token_mask(
    entropy: torch.Tensor, response_mask: torch.Tensor, quantile: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Which response tokens carry the policy gradient: the top ``quantile`` share by rollout entropy.

    Args:
        entropy: ``[B, R]`` float, nats.
        response_mask: ``[B, R]`` 0/1: the tokens that count (model-generated, not padding).
        quantile: ``q`` in ``(0, 1]``.

    Returns:
        ``keep``: ``[B, R]`` bool, a subset of ``response_mask``; and the metrics ``threshold`` (nats; absent when
        the batch has no response token), ``kept_share`` (kept / response tokens), ``entropy_kept_mean`` and
        ``entropy_dropped_mean`` (nats; absent when the set is empty).
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"pg_token_quantile must be in (0, 1], got {quantile}")
    counted = response_mask.bool()
    values = entropy[counted]
    if values.numel() == 0:
        return torch.zeros_like(counted), {"kept_share": 0.0}
    k = math.ceil(round(quantile * values.numel(), 9))
    threshold = torch.topk(values.float(), k, sorted=True).values[-1]
    keep = counted & (entropy >= threshold)
    metrics = {"threshold": float(threshold), "kept_share": float(keep.sum()) / values.numel()}
    dropped = counted & ~keep
    if keep.any():
        metrics["entropy_kept_mean"] = float(entropy[keep].double().mean())
    if dropped.any():
        metrics["entropy_dropped_mean"] = float(entropy[dropped].double().mean())
    return keep, metrics


def entropy_shaped_advantages(
    advantages: torch.Tensor, entropy: torch.Tensor, response_mask: torch.Tensor, alpha: float, kappa: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``A + min(alpha * H, |A| / kappa)`` at response tokens, ``A`` elsewhere (all ``[B, R]``).

    The bonus is capped by ``|A| / kappa`` so that it never flips the sign of a token's advantage (``kappa > 1``).

    Returns:
        The shaped advantages and the metrics ``bonus_mean`` (over response tokens) and ``capped_share`` (tokens
        where ``|A| / kappa`` is the smaller term).
    """
    if alpha < 0 or kappa <= 1:
        raise ValueError(f"entropy advantage shaping needs alpha >= 0 and kappa > 1, got alpha={alpha}, kappa={kappa}")
    counted = response_mask.bool()
    raw_bonus = alpha * entropy.detach().to(advantages.dtype)
    cap = advantages.abs() / kappa
    bonus = torch.where(counted, torch.minimum(raw_bonus, cap), torch.zeros_like(advantages))
    metrics: dict[str, float] = {}
    if counted.any():
        metrics["bonus_mean"] = float(bonus[counted].double().mean())
        metrics["capped_share"] = float((cap < raw_bonus)[counted].double().mean())
    return advantages + bonus, metrics


def mask_advantages(advantages: torch.Tensor, keep: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Advantages with the response tokens outside ``keep`` set to 0; every other value unchanged, bit for bit."""
    drop = response_mask.bool() & ~keep
    return torch.where(drop, torch.zeros_like(advantages), advantages)
