# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""An early warning of entropy collapse, from the forecast's series of updates.

Each forecast (``live.py``) reports, per actor update, E's token entropy at θ (``probe/token/H_before``, nats per
token), the forecast of its change along the update's first optimizer step (``probe/token/deltaH1`` ± ``_se``), the
realised change at the same states after that step and after the whole update (``probe/token/deltaH_realised_first_step``,
``probe/token/deltaH_realised``), the paired standard error of realised − forecast (``probe/token/error_se``) and the
update's optimizer steps. From them, per forecast:

- ``probe/warning/rate``: the forecast's relative rate per training step, the mean over the last ``window`` forecasts
  of ``ΔH₁ · optimizer_steps / H_before`` (first order: every optimizer step of an update moves entropy as its first
  one), ± ``probe/warning/rate_se``;
- ``probe/warning/steps_to_fraction``: training steps until the entropy falls to ``fraction`` of its value at that
  rate, ``ln(fraction) / rate`` (at most ``10 · horizon``, its value when the rate is not negative);
- ``probe/warning/rate_on_policy`` ± ``_se``, ``steps_to_fraction_on_policy``: the same from the on-policy forecast
  (``probe/token/deltaH1_on_policy``: the tangent plus the shift of the states' distribution, which the rollout
  entropy, the curve that collapses, also moves with; NaN where the forecast has none, the backward method);
- ``probe/warning/collapse`` = 1.0 when ``steps_to_fraction <= horizon`` and the rate is negative beyond ``z`` of its
  standard errors, from the ``skip + 1``-th forecast on (the first forecasts are skipped: Adam's
  first step moves every parameter by the learning rate, whatever its gradient's size, and is no sample of the run's
  later steps; on the CPU study's SmolLM2 runs it is the largest step of the run, ‖Δθ‖ ≈ 1.05 against 0.2-0.75 after
  it). ``probe/warning/collapse_on_policy`` = 1.0 when the on-policy forecast's projection meets the same condition;
  it counts in ``collapse`` only with ``on_policy: true`` (default false). Measured on the study's runs
  (``treetune_specs/2026-11-28-forecast-calibration.md``): where the rollout entropy fell by a third in one step
  (1.44 → 0.94 nats, responses 20 → 10 tokens) the tangent forecast E's states' change at −0.044 nats and the on-policy
  forecast at −0.24 ± 0.06, a warning one step earlier (lead 2 instead of 1); but on a held-out stable arm it warned
  once (−4.6 % ± 1.3 % per step) where the tangent stayed quiet, on every stable arm so far;
- ``probe/warning/disagreement_z`` = ``|realised − ΔH₁| / error_se`` and ``probe/warning/disagree_streak``, the
  consecutive forecasts with ``z > z``; ``probe/warning/disagree`` = 1.0 when the streak reaches ``consecutive``: the
  first-order forecast does not describe this run's steps;
- ``probe/warning/entropy``: E's token entropy after the update, for the plot.

Each warning comes with a warning line in the log (rank 0). The rule and its settings were chosen on the CPU study's
runs and judged on runs they were not chosen on (``treetune_specs/2026-11-28-forecast-calibration.md``). The state is
the forecasting worker's (one per actor process, kept across updates; a resumed run starts afresh).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from treetune_verl.config.job_config import is_int
from treetune_verl.config.keys import check_known_keys

logger = logging.getLogger(__name__)

PREFIX = "probe/warning/"
TOKEN = "probe/token/"
# The forecasts whose rate is projected, by their probe/token/ key: the tangent at E's states (ΔH₁) and the on-policy
# forecast (the tangent plus the shift of the states' distribution, token_entropy.py).
PROJECTED = {"tangent": "deltaH1", "on_policy": "deltaH1_on_policy"}
REMOVED_KEYS = {"floor": "the warning is relative to the entropy now: `fraction` within `horizon` steps"}


@dataclass(frozen=True)
class WarningSettings:
    """``...entropy_forecast.early_warning``: warn when the forecast rate would bring the entropy to ``fraction`` of
    its value within ``horizon`` training steps (``window`` forecasts averaged, the first ``skip`` ignored, the rate
    ``z`` standard errors below 0); ``consecutive`` forecasts beyond ``z`` of the realised change: disagreement."""

    fraction: float = 0.5
    horizon: int = 20
    window: int = 1
    skip: int = 1
    z: float = 2.0
    consecutive: int = 3
    on_policy: bool = False  # also warn from the on-policy forecast's projection (module docstring: measured trade-off)


@dataclass
class EarlyWarning:
    """Folds each forecast's metrics into the rate and the warnings (module docstring)."""

    settings: WarningSettings = field(default_factory=WarningSettings)
    forecasts: int = 0
    streak: int = 0
    _rates: dict[str, deque] = field(init=False)  # per projected forecast, the last `window` (rate, its SE) pairs

    def __post_init__(self) -> None:
        self._rates = {source: deque(maxlen=self.settings.window) for source in PROJECTED}

    def observe(self, metrics: Mapping[str, float], log: bool = True) -> dict[str, float]:
        """The ``probe/warning/*`` metrics of one forecast's ``probe/*`` metrics; logs a warning line for each
        warning when ``log`` (one rank logs).

        Raises:
            KeyError: a ``probe/*`` metric the forecast always reports is missing (naming it).
        """
        s = self.settings
        self.forecasts += 1
        forecast = _get(metrics, TOKEN + "deltaH1")
        steps = _get(metrics, "probe/optimizer_steps")
        h_before = _get(metrics, TOKEN + "H_before")
        entropy = h_before + _get(metrics, TOKEN + "deltaH_realised")
        scale = steps / h_before if h_before > 0 else math.nan
        projections = {}
        for source, key in PROJECTED.items():  # NaN: a forecast this run does not report
            value, se = metrics.get(TOKEN + key, math.nan), metrics.get(TOKEN + key + "_se", math.nan)
            projections[source] = self._project(source, value, se, scale)
        rate, rate_se, to_fraction, collapse = projections["tangent"]
        on_rate, on_se, on_steps, on_warns = projections["on_policy"]
        collapse = collapse or (s.on_policy and on_warns)
        error_se = metrics.get(TOKEN + "error_se", math.nan)
        realised = _get(metrics, TOKEN + "deltaH_realised_first_step")
        z = abs(realised - forecast) / error_se if error_se > 0 else math.nan
        self.streak = self.streak + 1 if z > s.z else 0  # NaN compares False: no evidence ends a streak
        disagree = self.streak >= s.consecutive
        for source, (p_rate, p_se, p_steps, warns) in projections.items():
            if log and warns and (source == "tangent" or s.on_policy):
                logger.warning(
                    f"entropy early warning (forecast {self.forecasts}): the {source} forecast's rate {p_rate:+.3%} "
                    f"per training step (± {p_se:.3%}) brings the token entropy ({entropy:.4g} nats) to "
                    f"{s.fraction:g} of its value in {p_steps:.1f} steps (horizon {s.horizon})"
                )
        if log and disagree:
            logger.warning(
                f"entropy early warning (forecast {self.forecasts}): forecast ΔH₁ and the realised change disagree "
                f"beyond their standard error for {self.streak} consecutive forecasts (z = {z:.2f} > {s.z:g}): the "
                "first-order forecast does not describe this run's updates"
            )
        return {
            PREFIX + "entropy": entropy,
            PREFIX + "rate": rate,
            PREFIX + "rate_se": rate_se,
            PREFIX + "steps_to_fraction": to_fraction,
            PREFIX + "disagreement_z": z,
            PREFIX + "disagree_streak": float(self.streak),
            PREFIX + "rate_on_policy": on_rate,
            PREFIX + "rate_on_policy_se": on_se,
            PREFIX + "steps_to_fraction_on_policy": on_steps,
            PREFIX + "collapse_on_policy": float(on_warns),
            PREFIX + "collapse": float(collapse),
            PREFIX + "disagree": float(disagree),
        }

    def _project(self, source: str, forecast: float, se: float, scale: float) -> tuple[float, float, float, bool]:
        """``(rate, rate_se, steps_to_fraction, warns)`` of one projected forecast, its rate averaged over the last
        ``window`` forecasts; NaN (no forecast, e.g. the on-policy one of the backward method) never warns."""
        s = self.settings
        rates = self._rates[source]
        rates.append((forecast * scale, se * scale))
        rate = sum(r for r, _ in rates) / len(rates)
        rate_se = math.sqrt(sum(e * e for _, e in rates)) / len(rates)
        cap = 10.0 * s.horizon  # a rate that is not negative, or too slow to matter
        to_fraction = min(math.log(s.fraction) / rate, cap) if rate < 0 else cap
        significant = rate + s.z * rate_se < 0  # NaN compares False: no standard error, no warning
        return rate, rate_se, to_fraction, self.forecasts > s.skip and to_fraction <= s.horizon and significant


def warning_settings(section: Any, where: str) -> WarningSettings:
    """:class:`WarningSettings` from the ``early_warning`` mapping (``None``: the defaults).

    Raises:
        ValueError: an unknown or removed key or a bad value, naming ``<where>.<key>``.
    """
    if section is None:
        return WarningSettings()
    if not isinstance(section, Mapping):
        raise ValueError(f"{where} must be a mapping of {sorted(vars(WarningSettings()))}; got {section!r}")
    removed = sorted(set(section) & set(REMOVED_KEYS))
    if removed:
        raise ValueError(f"{where}.{removed[0]}: removed ({REMOVED_KEYS[removed[0]]})")
    defaults = WarningSettings()
    check_known_keys(section, vars(defaults), where)
    values = {**vars(defaults), **section}
    for key in ("horizon", "window", "consecutive"):
        if not is_int(values[key]) or values[key] < 1:
            raise ValueError(f"{where}.{key} must be an integer >= 1, got {values[key]!r}")
    if not is_int(values["skip"]) or values["skip"] < 0:
        raise ValueError(f"{where}.skip must be an integer >= 0, got {values['skip']!r}")
    fraction = values["fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction < 1:
        raise ValueError(f"{where}.fraction must be a number in (0, 1), got {fraction!r}")
    if not isinstance(values["on_policy"], bool):
        raise ValueError(f"{where}.on_policy must be true or false, got {values['on_policy']!r}")
    z = values["z"]
    if isinstance(z, bool) or not isinstance(z, int | float) or not math.isfinite(z) or z < 0:
        raise ValueError(f"{where}.z must be a finite number >= 0, got {z!r}")
    return WarningSettings(**values)


def _get(metrics: Mapping[str, float], key: str) -> float:
    if key not in metrics:
        raise KeyError(f"the forecast's metrics lack {key!r}")
    return float(metrics[key])
