# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Probe configuration: defaults in ``probe.yaml``, merged and validated here.

``resolve_config`` accepts a full or partial config (dict or DictConfig), merges it onto the defaults in struct
mode (an unknown key raises) and validates every enumerated or ranged value, naming the key in the error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from treetune_verl.config.job_config import check_positive_ints, load_defaults, merge_onto_defaults
from treetune_verl.probe.policy import check_policy_args

CONFIG_DIR = Path(__file__).resolve().parent
CONFIG_NAME = "probe"

# The one map from dtype names to torch dtypes: ``model.dtype`` and ``probe.buffers_dtype`` are validated against it.
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}

_CHOICES = {
    "model.dtype": tuple(name for name in DTYPES if name != "float64"),  # fp64 is for accumulating buffers only
    "advantage.estimator": ("grpo", "dr_grpo"),
    "estimator.x_estimator_mode": ("naive", "rb_residual"),
    "estimator.baseline.mode": ("none", "residual_mu", "loo"),
    "probe.buffers_dtype": tuple(DTYPES),
    "probe.buffers_device": ("cpu", "model"),
    "probe.weighting_mode": ("dr_grpo", "per_token_avg"),
    "probe.preconditioner": ("optimizer", "identity"),
    "optimizer.name": ("sgd", "adam", "adamw"),
}
_POSITIVE_INTS = (
    "generation.max_new_tokens",
    "generation.batch_size",
    "batch.B_E",
    "batch.B_U",
    "batch.G",
    "probe.mb_size_prompts",
    "run.repeats",
)


def load_default_config() -> DictConfig:
    """The packaged defaults (without Hydra's own ``hydra:`` block)."""
    return load_defaults(CONFIG_DIR / f"{CONFIG_NAME}.yaml")


def resolve_config(config: DictConfig | dict[str, Any] | None = None) -> DictConfig:
    """Defaults ← ``config`` (struct merge), validated. Returns a new DictConfig."""
    base = merge_onto_defaults(load_default_config(), config, "probe")
    validate_config(base)
    return base


def validate_config(cfg: DictConfig) -> None:
    """Raise ``ValueError`` naming the key for any out-of-range or unknown value."""
    for key, allowed in _CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ValueError(f"{key} must be one of {list(allowed)}, got {value!r}")
    check_positive_ints(cfg, _POSITIVE_INTS)
    decay = cfg.estimator.baseline.ema_decay
    if not isinstance(decay, int | float) or not 0.0 <= float(decay) < 1.0:
        raise ValueError(f"estimator.baseline.ema_decay must be in [0, 1), got {decay!r}")
    check_policy_args(float(cfg.generation.temperature), float(cfg.generation.top_p))
    if not float(cfg.optimizer.lr) >= 0:
        raise ValueError(f"optimizer.lr must be >= 0, got {cfg.optimizer.lr!r}")
    if not float(cfg.advantage.eps) > 0:
        raise ValueError(f"advantage.eps must be > 0, got {cfg.advantage.eps!r}")
    if len(cfg.optimizer.betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in cfg.optimizer.betas):
        raise ValueError(f"optimizer.betas must be two numbers in [0, 1), got {list(cfg.optimizer.betas)!r}")
    if int(cfg.optimizer.state_warmup_batches) < 0:
        raise ValueError(f"optimizer.state_warmup_batches must be >= 0, got {cfg.optimizer.state_warmup_batches!r}")
    if int(cfg.prompts.max_operand) < 1:
        raise ValueError(f"prompts.max_operand must be >= 1, got {cfg.prompts.max_operand!r}")
    estimators = list(cfg.run.estimators)
    if not estimators or any(e not in _CHOICES["estimator.x_estimator_mode"] for e in estimators):
        raise ValueError(f"run.estimators must be a non-empty list from ['naive', 'rb_residual'], got {estimators!r}")
