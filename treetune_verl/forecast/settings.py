# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast's settings: ``actor_rollout_ref.rollout.custom.entropy_forecast``, read and checked in the actor.

``custom`` is verl's free-form extension point of ``RolloutConfig`` (the actor's own config is a closed dataclass);
the actor worker holds the whole ``actor_rollout_ref`` section, so it reads the forecast's keys there. Keys:

    every: int >= 1          forecast the update of every k-th ``update_actor`` call of this worker (1, 1+k, ...)
    estimators: list         X estimators, a non-empty subset of [naive, rb_residual] (naive needs rollout.n >= 2)
    top_p: float             the rollout's nucleus (verl's actor assumes 1.0; the probe's policy must match sampling)
    seed: int                seeds E's sampling (with the step and the rank)
    probe: dict              a partial probe config (``treetune_verl/probe/config/probe.yaml``: ``estimator.*``,
                             ``probe.buffers_dtype``...), merged and validated by the probe's ``resolve_config``

A section that is absent or null turns the forecast off; anything else wrong raises ``ValueError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from treetune_verl.config.job_config import is_int
from treetune_verl.probe.config import resolve_config

SECTION = "actor_rollout_ref.rollout.custom.entropy_forecast"
ESTIMATORS = ("naive", "rb_residual")
_KEYS = {"every", "estimators", "top_p", "seed", "probe"}


@dataclass(frozen=True)
class ForecastSettings:
    every: int = 1
    estimators: tuple[str, ...] = ESTIMATORS
    top_p: float = 1.0
    seed: int = 0
    probe: dict[str, Any] = field(default_factory=dict)

    def probe_config(self, estimator: str, temperature: float) -> DictConfig:
        """The probe's resolved config for one X estimator under the rollout's policy (temperature, top_p)."""
        overrides = OmegaConf.merge(
            OmegaConf.create(self.probe),
            {"generation": {"temperature": temperature, "top_p": self.top_p}},
            {"estimator": {"x_estimator_mode": estimator}, "probe": {"preconditioner": "optimizer"}},
        )
        return resolve_config(overrides)


def _get(config: Any, key: str) -> Any:
    if config is None:
        return None
    if isinstance(config, Mapping | DictConfig):
        return config.get(key)
    return getattr(config, key, None)


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def forecast_settings(rollout_config: Any) -> ForecastSettings | None:
    """``ForecastSettings`` from a rollout config (DictConfig, dict or verl's ``RolloutConfig``), or ``None`` (off).

    Raises:
        ValueError: an unknown key or a bad value, naming ``actor_rollout_ref.rollout.custom.entropy_forecast.<key>``.
    """
    section = _plain(_get(_get(rollout_config, "custom"), "entropy_forecast"))
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ValueError(f"{SECTION} must be a mapping of {sorted(_KEYS)}, got {section!r}")
    unknown = sorted(set(section) - _KEYS)
    if unknown:
        raise ValueError(f"{SECTION}: unknown keys {unknown} (known: {sorted(_KEYS)})")
    every = section.get("every", 1)
    if not is_int(every) or every < 1:
        raise ValueError(f"{SECTION}.every must be an integer >= 1, got {every!r}")
    estimators = section.get("estimators", list(ESTIMATORS))
    if (
        isinstance(estimators, str)
        or not estimators
        or any(e not in ESTIMATORS for e in estimators)
        or len(set(estimators)) != len(estimators)
    ):
        raise ValueError(
            f"{SECTION}.estimators must be a non-empty list of distinct {list(ESTIMATORS)}, got {estimators!r}"
        )
    top_p = section.get("top_p", 1.0)
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise ValueError(f"{SECTION}.top_p must be in (0, 1], got {top_p!r}")
    seed = section.get("seed", 0)
    if not is_int(seed) or seed < 0:
        raise ValueError(f"{SECTION}.seed must be an integer >= 0, got {seed!r}")
    probe = _plain(section.get("probe")) or {}
    if not isinstance(probe, Mapping):
        raise ValueError(f"{SECTION}.probe must be a mapping (a partial probe config), got {probe!r}")
    settings = ForecastSettings(int(every), tuple(estimators), float(top_p), int(seed), dict(probe))
    for estimator in settings.estimators:
        try:
            settings.probe_config(estimator, 1.0)
        except ValueError as error:
            raise ValueError(f"{SECTION}.probe: {error}") from None
    return settings
