# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The early warning on synthetic forecast series: a flat run stays quiet, a collapsing one warns at the first
forecast whose rate would halve the entropy within the horizon (not at the skipped first one, however steep), a rate
within its standard errors of 0 does not warn, and a forecast that keeps disagreeing with the realised change warns
after ``consecutive`` forecasts. Expected figures are the arithmetic written out here."""

from __future__ import annotations

import logging
import math

import pytest

from treetune_verl.forecast.early_warning import EarlyWarning, WarningSettings, warning_settings

SETTINGS = WarningSettings(fraction=0.5, horizon=20, window=1, skip=1, z=2.0, consecutive=3)


def _forecast(h_before, forecast, realised, se=0.001, error_se=0.001, steps=1.0):
    """One forecast's ``probe/*`` metrics (E's token entropy): one optimizer step per update unless ``steps``."""
    return {
        "probe/token/H_before": h_before,
        "probe/token/deltaH1": forecast,
        "probe/token/deltaH1_se": se,
        "probe/token/deltaH_realised": realised * steps,
        "probe/token/deltaH_realised_first_step": realised,
        "probe/token/error_se": error_se,
        "probe/optimizer_steps": steps,
    }


def test_a_flat_run_is_quiet_and_a_collapse_warns_when_the_rate_halves_entropy_within_the_horizon(caplog):
    warning = EarlyWarning(SETTINGS)
    h, seen = 2.0, []
    # the first forecast a steep fall (skipped: Adam's first step), then flat, then falls of 1 %, 2 %, ... per update
    falls = [0.2] + [0.0] * 4 + [0.01 * k for k in range(1, 7)]
    with caplog.at_level(logging.WARNING, logger="treetune_verl.forecast.early_warning"):
        for fall in falls:
            seen.append(warning.observe(_forecast(h, -fall * h, -fall * h)))
            h -= fall * h
    rates = [m["probe/warning/rate"] for m in seen]
    assert rates == pytest.approx([-f for f in falls])
    # ln(½) / rate, at most 10 x the horizon; ≤ 20 steps first at a fall of 4 % (17.3 steps; 3 %: 23.1)
    expected = [min(math.log(0.5) / -f, 200.0) if f > 0 else 200.0 for f in falls]
    assert [m["probe/warning/steps_to_fraction"] for m in seen] == pytest.approx(expected)
    collapse = [m["probe/warning/collapse"] for m in seen]
    assert collapse == [0.0] * 8 + [1.0] * 3  # not the first (skipped), not at 1-3 %, from 4 % on
    lines = [r.getMessage() for r in caplog.records if "brings the token entropy" in r.getMessage()]
    assert len(lines) == 3 and "in 17.3 steps" in lines[0] and "-4.000%" in lines[0]
    assert all(m["probe/warning/disagree"] == 0.0 for m in seen)  # forecast and realised agree throughout


def test_a_rate_within_its_standard_errors_of_zero_does_not_warn():
    warning = EarlyWarning(SETTINGS)
    warning.observe(_forecast(1.0, 0.0, 0.0))  # skipped
    # -10 % per step (halving in 6.6 steps), but its standard error 6 %: -0.10 + 2 x 0.06 > 0
    quiet = warning.observe(_forecast(1.0, -0.10, -0.10, se=0.06))
    loud = warning.observe(_forecast(1.0, -0.10, -0.10, se=0.04))
    assert quiet["probe/warning/collapse"] == 0.0 and loud["probe/warning/collapse"] == 1.0
    assert quiet["probe/warning/rate_se"] == pytest.approx(0.06)
    no_se = {k: v for k, v in _forecast(1.0, -0.5, -0.5).items() if k != "probe/token/deltaH1_se"}
    assert warning.observe(no_se)["probe/warning/collapse"] == 0.0  # no standard error, no evidence


def test_a_forecast_disagreeing_for_consecutive_steps_warns_once_the_streak_is_long_enough(caplog):
    warning = EarlyWarning(SETTINGS)
    # forecast -0.05 vs realised +0.02, the paired difference ± 0.01: z = 7 > 2; one agreeing forecast resets
    pattern = ["off", "off", "on", "off", "off", "off", "off"]
    with caplog.at_level(logging.WARNING, logger="treetune_verl.forecast.early_warning"):
        seen = [warning.observe(_forecast(2.0, -0.05, 0.02 if p == "off" else -0.05, error_se=0.01)) for p in pattern]
    assert [m["probe/warning/disagree_streak"] for m in seen] == [1, 2, 0, 1, 2, 3, 4]
    assert [m["probe/warning/disagree"] for m in seen] == [0, 0, 0, 0, 0, 1, 1]
    assert seen[0]["probe/warning/disagreement_z"] == pytest.approx(7.0)
    lines = [r.getMessage() for r in caplog.records if "disagree beyond their standard error" in r.getMessage()]
    assert len(lines) == 2 and "for 3 consecutive forecasts" in lines[0]


def test_the_rate_averages_the_window_and_counts_every_optimizer_step():
    warning = EarlyWarning(WarningSettings(window=2))
    warning.observe(_forecast(1.0, -0.01, -0.01, se=0.002, steps=2.0))
    metrics = warning.observe(_forecast(0.98, -0.03, -0.03, se=0.004, steps=2.0))
    rates = [-0.01 * 2 / 1.0, -0.03 * 2 / 0.98]  # per training step, relative: ΔH₁ x optimizer steps / H_before
    assert metrics["probe/warning/rate"] == pytest.approx(sum(rates) / 2)
    assert metrics["probe/warning/rate_se"] == pytest.approx(math.hypot(0.002 * 2 / 1.0, 0.004 * 2 / 0.98) / 2)
    assert metrics["probe/warning/entropy"] == pytest.approx(0.98 - 0.06)  # E's entropy after the whole update


def test_the_on_policy_forecast_is_projected_always_and_warns_only_when_asked(caplog):
    """A sudden collapse the tangent does not see (E's states changed by -2 % per step: no warning) but the on-policy
    forecast does (-15 % ± 3 %: halving in 4.3 steps, 5 SEs below 0); numbers of a pinned study run, rounded. Its
    projection is reported either way; it warns only with ``on_policy=True`` (default off)."""
    steps = [_forecast(1.5, 0.0, 0.0), _forecast(1.5, -0.03, -0.03)]
    steps[1] |= {"probe/token/deltaH1_on_policy": -0.225, "probe/token/deltaH1_on_policy_se": 0.045}
    on, default = EarlyWarning(WarningSettings(on_policy=True)), EarlyWarning(SETTINGS)
    assert not SETTINGS.on_policy
    with caplog.at_level(logging.WARNING, logger="treetune_verl.forecast.early_warning"):
        seen_default = [default.observe(m) for m in steps]
        assert not caplog.records  # the default rule: quiet, and no line
        seen_on = [on.observe(m) for m in steps]
    assert seen_on[1]["probe/warning/collapse"] == 1.0 and "the on_policy forecast's rate" in caplog.text
    for seen in (seen_on, seen_default):
        assert seen[1]["probe/warning/collapse_on_policy"] == 1.0
        assert seen[1]["probe/warning/rate"] == pytest.approx(-0.02)  # the tangent's rate alone: quiet
        assert seen[1]["probe/warning/rate_on_policy"] == pytest.approx(-0.15)
        assert seen[1]["probe/warning/steps_to_fraction_on_policy"] == pytest.approx(math.log(0.5) / -0.15)
        # a forecast without the on-policy figure (the backward method): NaN, no warning from it
        assert math.isnan(seen[0]["probe/warning/rate_on_policy"]) and seen[0]["probe/warning/collapse"] == 0.0
    assert seen_default[1]["probe/warning/collapse"] == 0.0


def test_missing_metrics_are_named():
    with pytest.raises(KeyError, match="probe/optimizer_steps"):
        EarlyWarning(SETTINGS).observe({"probe/token/deltaH1": 0.0, "probe/token/H_before": 1.0})


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"fractoin": 0.5}, r"early_warning.fractoin: unknown key; did you mean .fraction."),
        ({"floor": 0.1}, r"early_warning.floor: removed"),
        ({"horizon": 0}, r"early_warning.horizon must be an integer >= 1"),
        ({"window": True}, r"early_warning.window must be an integer >= 1"),
        ({"skip": -1}, r"early_warning.skip must be an integer >= 0"),
        ({"fraction": 1.0}, r"early_warning.fraction must be a number in \(0, 1\)"),
        ({"z": float("inf")}, r"early_warning.z must be a finite number >= 0"),
        ({"on_policy": "yes"}, r"early_warning.on_policy must be true or false"),
        ("on", r"must be a mapping"),
    ],
)
def test_settings_refuse_bad_values_naming_the_key(section, words):
    with pytest.raises(ValueError, match=words):
        warning_settings(section, "x.early_warning")
    assert warning_settings(None, "x") == WarningSettings()
    assert warning_settings({"horizon": 10, "skip": 0}, "x") == WarningSettings(horizon=10, skip=0)
