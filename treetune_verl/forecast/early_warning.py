# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""An early warning of entropy collapse, from the forecast's series of updates.

Each forecast (``live.py``) reports, per actor update, in nats per budget token: the entropy of E at θ
(``probe/H_before``), the forecast ΔH₁ of the update's first optimizer step (``probe/deltaH1/<estimator>`` ± its
standard error), the realised change of that step and of the whole update (``probe/deltaH_realised_first_step``,
``probe/deltaH_realised``, ± theirs) and the update's optimizer steps. From them, per forecast:

- the entropy now, ``H = H_before + deltaH_realised``, and the forecast rate per training step,
  ``r = mean of the last `window` forecasts' ΔH₁ · optimizer_steps`` (first order: every optimizer step of an update
  moves entropy as its first one);
- ``probe/warning/steps_to_floor``: training steps until ``H`` falls to ``floor`` at that rate, ``(H - floor) / -r``
  (0 at or below the floor; ``horizon`` when the rate does not reach it within ``horizon`` steps);
  ``probe/warning/steps_to_floor_realised`` the same at the realised rate (``deltaH_realised`` over the window);
- ``probe/warning/disagreement_z``: ``|ΔH₁ - deltaH_realised_first_step| / sqrt(se₁² + se_realised²)`` (NaN without
  both standard errors) and ``probe/warning/disagree_streak``, the consecutive forecasts with ``z > z``;
- ``probe/warning/collapse`` (1.0 when ``steps_to_floor < horizon``) and ``probe/warning/disagree`` (1.0 when the
  streak reaches ``consecutive``), each with a warning line in the log.

The state is the forecasting worker's (one per actor process, kept across updates; a resumed run starts afresh).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from treetune_verl.config.job_config import is_int

logger = logging.getLogger(__name__)

PREFIX = "probe/warning/"
ESTIMATOR_PREFERENCE = ("rb_residual", "naive")  # the lower-variance estimator first


@dataclass(frozen=True)
class WarningSettings:
    """``...entropy_forecast.early_warning``: ``floor`` (nats per budget token), ``horizon`` (training steps),
    ``window`` (forecasts averaged into the rate), ``z`` and ``consecutive`` (the disagreement rule)."""

    floor: float = 0.1
    horizon: int = 100
    window: int = 3
    z: float = 2.0
    consecutive: int = 3


@dataclass
class EarlyWarning:
    """Folds each forecast's metrics into the projection and the warnings (module docstring)."""

    settings: WarningSettings = field(default_factory=WarningSettings)
    forecasts: int = 0
    streak: int = 0
    _rates: deque = field(init=False)  # the last `window` forecast rates per training step
    _realised: deque = field(init=False)  # the last `window` realised changes per update

    def __post_init__(self) -> None:
        self._rates = deque(maxlen=self.settings.window)
        self._realised = deque(maxlen=self.settings.window)

    def observe(self, metrics: Mapping[str, float], log: bool = True) -> dict[str, float]:
        """The ``probe/warning/*`` metrics of one forecast's ``probe/*`` metrics; logs a warning line for each
        warning when ``log`` (one rank logs).

        Raises:
            KeyError: a ``probe/*`` metric the forecast always reports is missing (naming it).
        """
        s = self.settings
        self.forecasts += 1
        estimator = next((e for e in ESTIMATOR_PREFERENCE if f"probe/deltaH1/{e}" in metrics), None)
        if estimator is None:
            raise KeyError(f"no probe/deltaH1/<estimator> among the forecast's metrics: {sorted(metrics)}")
        forecast = _get(metrics, f"probe/deltaH1/{estimator}")
        steps = _get(metrics, "probe/optimizer_steps")
        entropy = _get(metrics, "probe/H_before") + _get(metrics, "probe/deltaH_realised")
        self._rates.append(forecast * steps)
        self._realised.append(_get(metrics, "probe/deltaH_realised"))
        rate = _mean(self._rates)
        to_floor = _steps_to_floor(entropy, rate, s.floor, s.horizon)
        se = math.hypot(
            metrics.get(f"probe/deltaH1_se/{estimator}", math.nan),
            metrics.get("probe/deltaH_realised_first_step_se", math.nan),
        )
        z = abs(forecast - _get(metrics, "probe/deltaH_realised_first_step")) / se if se > 0 else math.nan
        self.streak = self.streak + 1 if z > s.z else 0  # NaN compares False: no evidence ends a streak
        collapse, disagree = to_floor < s.horizon, self.streak >= s.consecutive
        if log and collapse:
            logger.warning(
                f"entropy early warning (forecast {self.forecasts}): entropy {entropy:.4g} nats per budget token is "
                f"projected to reach the floor {s.floor:g} in {to_floor:.1f} training steps at the forecast rate "
                f"{rate:.3g} per step ({estimator}, mean of the last {len(self._rates)} forecasts)"
            )
        if log and disagree:
            logger.warning(
                f"entropy early warning (forecast {self.forecasts}): forecast ΔH₁ and the realised change disagree "
                f"beyond their standard errors for {self.streak} consecutive forecasts (z = {z:.2f} > {s.z:g}): the "
                "first-order forecast does not describe this run's updates"
            )
        return {
            PREFIX + "floor": s.floor,
            PREFIX + "entropy": entropy,
            PREFIX + "rate": rate,
            PREFIX + "steps_to_floor": to_floor,
            PREFIX + "steps_to_floor_realised": _steps_to_floor(entropy, _mean(self._realised), s.floor, s.horizon),
            PREFIX + "disagreement_z": z,
            PREFIX + "disagree_streak": float(self.streak),
            PREFIX + "collapse": float(collapse),
            PREFIX + "disagree": float(disagree),
        }


def warning_settings(section: Any, where: str) -> WarningSettings:
    """:class:`WarningSettings` from the ``early_warning`` mapping (``None``: the defaults).

    Raises:
        ValueError: an unknown key or a bad value, naming ``<where>.<key>``.
    """
    if section is None:
        return WarningSettings()
    if not isinstance(section, Mapping):
        raise ValueError(f"{where} must be a mapping of floor, horizon, window, z, consecutive; got {section!r}")
    defaults = WarningSettings()
    unknown = sorted(set(section) - set(vars(defaults)))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (known: {sorted(vars(defaults))})")
    values = {**vars(defaults), **section}
    for key in ("horizon", "window", "consecutive"):
        if not is_int(values[key]) or values[key] < 1:
            raise ValueError(f"{where}.{key} must be an integer >= 1, got {values[key]!r}")
    for key in ("floor", "z"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}.{key} must be a finite number >= 0, got {value!r}")
    return WarningSettings(**values)


def _get(metrics: Mapping[str, float], key: str) -> float:
    if key not in metrics:
        raise KeyError(f"the forecast's metrics lack {key!r}")
    return float(metrics[key])


def _mean(values: deque) -> float:
    return sum(values) / len(values)


def _steps_to_floor(entropy: float, rate: float, floor: float, horizon: int) -> float:
    """Training steps until ``entropy`` reaches ``floor`` at ``rate`` per step, capped at ``horizon``."""
    if entropy <= floor:
        return 0.0
    if not rate < 0:
        return float(horizon)
    return min((entropy - floor) / -rate, float(horizon))
