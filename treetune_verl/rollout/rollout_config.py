# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Reading and checking the rollout entropy settings in verl's config (``actor_rollout_ref.rollout``).

Used at start-up by the manager (before any server exists) and by the server's ``launch_server``: both refuse
settings under which entropy would be missing or misaligned, with messages naming the config key. Does not import
sglang.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.server_args import check_server_args

CONFIG_PATH = "actor_rollout_ref.rollout"
ENTROPY_SECTION = "entropy"  # actor_rollout_ref.rollout.custom.entropy
# the sampler's and the actor's replay of its support; the trainer's steering keys share the section (ppo/entropy_advantage)
ENTROPY_KEYS = ("top_k", "mode", "replay")
MANAGED_SECTION = "managed"  # actor_rollout_ref.rollout.custom.managed
MANAGED_KEYS = ("agent_fn", "environment", "rows_per_session")
ROWS_PER_SESSION_KEY = f"{CONFIG_PATH}.custom.{MANAGED_SECTION}.rows_per_session"


def read_key(config: Any, key: str, default: Any = None) -> Any:
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
    section = read_key(read_key(rollout_config, "custom"), ENTROPY_SECTION) or {}
    top_k = read_key(section, "top_k", 0)
    mode = read_key(section, "mode", "raw")
    try:
        return EntropyConfig(top_k=top_k, mode=mode)
    except ValueError as exc:
        raise ValueError(f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}: {exc}") from None


def support_replay(rollout_config: Any) -> bool:
    """``rollout.custom.entropy.replay`` (mode ``support`` only; default true): the actor scores each token over the
    support it was sampled from. False keeps verl's full-vocabulary actor against the behaviour log-probs of the
    sampled distribution: the gap replay removes, measured (``rollout_support/importance_ratio_mean``).

    Raises:
        ValueError: not a bool, or set in another mode (naming the key).
    """
    section = read_key(read_key(rollout_config, "custom"), ENTROPY_SECTION) or {}
    replay = read_key(section, "replay", None)
    if replay is None:
        return entropy_config(rollout_config).mode == "support"
    if not isinstance(replay, bool):
        raise ValueError(f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}.replay must be true or false, got {replay!r}")
    if entropy_config(rollout_config).mode != "support":
        raise ValueError(
            f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}.replay is the sampled support's replay: it needs "
            f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}.mode=support"
        )
    return replay


def managed_section(rollout_config: Any) -> Any:
    """``rollout.custom.managed`` (managed agent sessions; ``{}`` when absent)."""
    return read_key(read_key(rollout_config, "custom"), MANAGED_SECTION) or {}


def rows_per_session(rollout_config: Any) -> int:
    """``rollout.custom.managed.rows_per_session`` (default 1): the rows each managed training session returns.

    Raises:
        ValueError: not an integer >= 1, or ``rollout.n`` is not a multiple of it (a prompt's ``n`` rows are
            ``n / k`` sessions of k rows).
    """
    k = read_key(managed_section(rollout_config), "rows_per_session", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{ROWS_PER_SESSION_KEY} must be an integer >= 1, got {k!r}")
    n = int(read_key(rollout_config, "n") or 1)
    if n % k:
        raise ValueError(
            f"{CONFIG_PATH}.n={n} must be a multiple of {ROWS_PER_SESSION_KEY}={k}: a prompt's n rows (its GRPO "
            "group) are n / k sessions of k rows each"
        )
    return k


def planned_server_args(rollout_config: Any) -> SimpleNamespace:
    """The sglang server arguments that decide entropy support, as verl 0.7.1's ``launch_server`` will set them.

    Re-states verl 0.7.1 ``workers/rollout/sglang_rollout/async_sglang_server.py`` ``SGLangHttpServer.launch_server``:
    ``args = {..., "dp_size": data_parallel_size, ..., **engine_kwargs}`` (lines 179-204), then, with ``mtp.enable``
    and ``mtp.enable_rollout``, ``args["speculative_algorithm"] = mtp.speculative_algorithm`` (from line 237).
    """
    args: dict[str, Any] = {"dp_size": read_key(rollout_config, "data_parallel_size", 1)}
    args.update(dict(read_key(read_key(rollout_config, "engine_kwargs"), "sglang") or {}))
    mtp = read_key(rollout_config, "mtp")
    if read_key(mtp, "enable", False) and read_key(mtp, "enable_rollout", False):
        args["speculative_algorithm"] = read_key(mtp, "speculative_algorithm")
    return SimpleNamespace(**args)


def check_rollout_config(rollout_config: Any) -> EntropyConfig:
    """Refuse rollout settings under which entropy would be missing or misaligned; returns the entropy settings.

    Raises:
        ValueError: ``calculate_log_probs`` is off (sglang returns entropy only with logprobs), or the entropy
            section is invalid.
        UnsupportedSGLangError: data-parallel sglang, speculative decoding, pipeline parallelism or disaggregation
            (see ``treetune_verl.sglang.server_args.check_server_args``).
    """
    if not read_key(rollout_config, "calculate_log_probs", False):
        raise ValueError(
            f"rollout entropy needs {CONFIG_PATH}.calculate_log_probs=True: sglang computes and returns per-token "
            "entropy only for requests that ask for logprobs"
        )
    config = entropy_config(rollout_config)
    support_replay(rollout_config)  # refused here when malformed
    check_server_args(planned_server_args(rollout_config), config.mode)
    return config
