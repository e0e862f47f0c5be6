# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Generation configuration: defaults in ``generation.yaml``, merged and validated here.

``resolve_config`` accepts a full or partial config (dict or DictConfig), merges it onto the defaults in struct mode
(an unknown key raises) and validates every value, naming the key in the error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from treetune_verl.config.job_config import check_positive_ints, is_int, load_defaults, merge_onto_defaults
from treetune_verl.generation.scoring import SCORERS

CONFIG_DIR = Path(__file__).resolve().parent
CONFIG_NAME = "generation"

_ENTROPY_MODES = ("raw", "tempered")  # treetune_verl.sglang.config.ENTROPY_MODES (not imported: pulls torch)
_POSITIVE_INTS = (
    "input.builtin_count",
    "sampling.n",
    "sampling.max_new_tokens",
    "engine.max_in_flight",
    "engine.max_running_requests",
    "output.rows_per_shard",
    "verl.nnodes",
    "verl.n_gpus_per_node",
    "verl.tensor_model_parallel_size",
    "verl.num_workers",
    "verl.batch_size",
)
BACKENDS = ("engine", "verl")


def load_default_config() -> DictConfig:
    """The packaged defaults (without Hydra's own ``hydra:`` block)."""
    return load_defaults(CONFIG_DIR / f"{CONFIG_NAME}.yaml")


def resolve_config(config: DictConfig | dict[str, Any] | None = None) -> DictConfig:
    """Defaults ← ``config`` (struct merge), validated. Returns a new DictConfig."""
    base = merge_onto_defaults(load_default_config(), config, "generation")
    validate_config(base)
    return base


def validate_config(cfg: DictConfig) -> None:
    """Raise ``ValueError`` naming the key for any out-of-range or unknown value."""
    check_positive_ints(cfg, _POSITIVE_INTS)
    if cfg.input.limit is not None and (not is_int(cfg.input.limit) or cfg.input.limit < 1):
        raise ValueError(f"input.limit must be null or a positive integer, got {cfg.input.limit!r}")
    if not float(cfg.sampling.temperature) >= 0:
        raise ValueError(f"sampling.temperature must be >= 0, got {cfg.sampling.temperature!r}")
    if not 0 < float(cfg.sampling.top_p) <= 1:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {cfg.sampling.top_p!r}")
    if not is_int(cfg.sampling.top_k) or (cfg.sampling.top_k < 1 and cfg.sampling.top_k != -1):
        raise ValueError(f"sampling.top_k must be -1 (off) or a positive integer, got {cfg.sampling.top_k!r}")
    if not is_int(cfg.entropy.top_k) or cfg.entropy.top_k < 0:
        raise ValueError(f"entropy.top_k must be an integer >= 0 (0 = full vocabulary), got {cfg.entropy.top_k!r}")
    if cfg.entropy.mode not in _ENTROPY_MODES:
        raise ValueError(f"entropy.mode must be one of {list(_ENTROPY_MODES)}, got {cfg.entropy.mode!r}")
    if cfg.entropy.mode == "tempered" and float(cfg.sampling.temperature) == 0:
        raise ValueError("entropy.mode=tempered needs sampling.temperature > 0 (greedy has no tempered distribution)")
    if cfg.score.function not in SCORERS:
        raise ValueError(f"score.function must be one of {list(SCORERS)}, got {cfg.score.function!r}")
    if cfg.model.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"model.device must be one of ['auto', 'cpu', 'cuda'], got {cfg.model.device!r}")
    if cfg.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {cfg.backend!r}")
    if cfg.verl.ray_address is not None and not isinstance(cfg.verl.ray_address, str):
        raise ValueError(f"verl.ray_address must be null, auto or host:port, got {cfg.verl.ray_address!r}")
    overrides = cfg.verl.overrides
    if not isinstance(overrides, ListConfig) or not all(isinstance(override, str) for override in overrides):
        raise ValueError(f"verl.overrides must be a list of Hydra override strings, got {cfg.verl.overrides!r}")
    if not float(cfg.output.flush_s) > 0:
        raise ValueError(f"output.flush_s must be > 0, got {cfg.output.flush_s!r}")
