# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main jobs' config mechanics, shared by the probe and the generation job: packaged YAML defaults, a partial
config merged onto them in struct mode (an unknown key raises, naming it), positive-integer checks naming the key."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def load_defaults(yaml_path: Path) -> DictConfig:
    """The packaged defaults at ``yaml_path``, without Hydra's own ``hydra:`` block."""
    cfg = OmegaConf.load(yaml_path)
    cfg.pop("hydra", None)
    return cfg


def merge_onto_defaults(defaults: DictConfig, config: DictConfig | dict[str, Any] | None, job: str) -> DictConfig:
    """``defaults`` ← ``config`` (struct merge; a ``hydra`` key is ignored). Raises ``ValueError`` naming ``job``."""
    OmegaConf.set_struct(defaults, True)
    if config is None:
        return defaults
    override = config if isinstance(config, DictConfig) else OmegaConf.create(config)
    override = OmegaConf.masked_copy(override, [k for k in override if k != "hydra"])
    try:
        return OmegaConf.merge(defaults, override)
    except Exception as exc:  # omegaconf raises ConfigKeyError / ValidationError subclasses
        raise ValueError(f"invalid {job} config: {exc}") from exc


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_ints(cfg: DictConfig, keys: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the first of ``keys`` (dotted) whose value is not a positive integer."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if not is_int(value) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
