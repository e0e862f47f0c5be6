# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Reading and checking the rollout entropy settings in verl's config (``actor_rollout_ref.rollout``).

Used at start-up by the manager (before any server exists) and by the server's ``launch_server``: both refuse
settings under which entropy would be missing or misaligned, with messages naming the config key. Does not import
sglang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.server_args import check_server_args

CONFIG_PATH = "actor_rollout_ref.rollout"
ENTROPY_SECTION = "entropy"  # actor_rollout_ref.rollout.custom.entropy.{top_k,mode}


def _get(config: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a DictConfig, a dict or a dataclass (verl hands out all three)."""
    if config is None:
        return default
    if isinstance(config, Mapping) or callable(getattr(config, "get", None)):
        return config.get(key, default)
    return getattr(config, key, default)


def entropy_config(rollout_config: Any) -> EntropyConfig:
    """``EntropyConfig`` from ``actor_rollout_ref.rollout.custom.entropy`` (absent keys take the defaults).

    ``custom`` is verl's extension point in ``RolloutConfig``; top-level rollout keys would be rejected by verl's
    dataclass conversion.
    """
    section = _get(_get(rollout_config, "custom"), ENTROPY_SECTION) or {}
    top_k = _get(section, "top_k", 0)
    mode = _get(section, "mode", "raw")
    try:
        return EntropyConfig(top_k=top_k, mode=mode)
    except ValueError as exc:
        raise ValueError(f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}: {exc}") from None


@dataclass(frozen=True)
class EntropySteering:
    """What the trainer does with rollout entropy (``custom.entropy``; all off by default).

    ``pg_token_quantile``: train the policy gradient only on the top ``q`` share of response tokens by rollout
    entropy (``None``: off). ``shaping_alpha`` / ``shaping_kappa``: the entropy-shaped advantage
    ``A + min(alpha * H, |A| / kappa)`` (``shaping_alpha`` ``None``: off). See ``treetune_verl/ppo/entropy_advantage.py``.
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
    section = _get(_get(rollout_config, "custom"), ENTROPY_SECTION) or {}
    where = f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}"
    quantile = _get(section, "pg_token_quantile")
    if quantile is not None and not 0.0 < float(quantile) <= 1.0:
        raise ValueError(f"{where}.pg_token_quantile must be in (0, 1] or null, got {quantile}")
    shaping = _get(section, "advantage_shaping") or {}
    alpha, kappa = _get(shaping, "alpha"), float(_get(shaping, "kappa", 2.0))
    if alpha is not None and (float(alpha) < 0 or kappa <= 1):
        raise ValueError(f"{where}.advantage_shaping needs alpha >= 0 and kappa > 1, got alpha={alpha}, kappa={kappa}")
    return EntropySteering(
        pg_token_quantile=None if quantile is None else float(quantile),
        shaping_alpha=None if alpha is None else float(alpha),
        shaping_kappa=kappa,
    )


def planned_server_args(rollout_config: Any) -> SimpleNamespace:
    """The sglang server arguments that decide entropy support, as verl 0.7.1's ``launch_server`` will set them.

    Re-states verl 0.7.1 ``workers/rollout/sglang_rollout/async_sglang_server.py`` ``SGLangHttpServer.launch_server``:
    ``args = {..., "dp_size": data_parallel_size, ..., **engine_kwargs}`` (lines 179-204), then, with ``mtp.enable``
    and ``mtp.enable_rollout``, ``args["speculative_algorithm"] = mtp.speculative_algorithm`` (from line 237).
    """
    args: dict[str, Any] = {"dp_size": _get(rollout_config, "data_parallel_size", 1)}
    args.update(dict(_get(_get(rollout_config, "engine_kwargs"), "sglang") or {}))
    mtp = _get(rollout_config, "mtp")
    if _get(mtp, "enable", False) and _get(mtp, "enable_rollout", False):
        args["speculative_algorithm"] = _get(mtp, "speculative_algorithm")
    return SimpleNamespace(**args)


def check_rollout_config(rollout_config: Any) -> EntropyConfig:
    """Refuse rollout settings under which entropy would be missing or misaligned; returns the entropy settings.

    Raises:
        ValueError: ``calculate_log_probs`` is off (sglang returns entropy only with logprobs), or the entropy
            section is invalid.
        UnsupportedSGLangError: data-parallel sglang, speculative decoding, pipeline parallelism or disaggregation
            (see ``treetune_verl.sglang.server_args.check_server_args``).
    """
    if not _get(rollout_config, "calculate_log_probs", False):
        raise ValueError(
            f"rollout entropy needs {CONFIG_PATH}.calculate_log_probs=True: sglang computes and returns per-token "
            "entropy only for requests that ask for logprobs"
        )
    config = entropy_config(rollout_config)
    check_server_args(planned_server_args(rollout_config))
    return config
