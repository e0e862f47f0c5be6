# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The early warning on synthetic forecast series: a flat run stays quiet, a collapsing one warns at the forecast
where the projection first reaches the floor within the horizon, and a forecast that keeps disagreeing with the
realised change warns after ``consecutive`` forecasts. Expected figures are the arithmetic written out here."""

from __future__ import annotations

import logging
import math

import pytest

from treetune_verl.forecast.early_warning import EarlyWarning, WarningSettings, warning_settings

SETTINGS = WarningSettings(floor=0.1, horizon=100, window=1, z=2.0, consecutive=3)


def _forecast(h_before, forecast, realised, se=0.01, realised_se=0.01, steps=1.0, estimator="rb_residual"):
    """One forecast's ``probe/*`` metrics: one optimizer step per update unless ``steps``."""
    return {
        "probe/H_before": h_before,
        f"probe/deltaH1/{estimator}": forecast,
        f"probe/deltaH1_se/{estimator}": se,
        "probe/deltaH_realised": realised * steps,
        "probe/deltaH_realised_first_step": realised,
        "probe/deltaH_realised_first_step_se": realised_se,
        "probe/optimizer_steps": steps,
    }


def test_a_flat_run_is_quiet_and_a_collapse_warns_when_the_projection_reaches_the_floor(caplog):
    warning = EarlyWarning(SETTINGS)
    h, seen = 2.0, []
    # 5 flat updates, then entropy falls 0.01, 0.02, 0.03 ... per update, each forecast right
    drops = [0.0] * 5 + [0.01 * k for k in range(1, 8)]
    with caplog.at_level(logging.WARNING, logger="treetune_verl.forecast.early_warning"):
        for drop in drops:
            seen.append(warning.observe(_forecast(h, -drop, -drop)))
            h -= drop
    to_floor = [m["probe/warning/steps_to_floor"] for m in seen]
    # flat: the rate never reaches the floor (the horizon); then (H now - 0.1) / drop, capped at the horizon
    expected, h = [], 2.0
    for drop in drops:
        h -= drop
        expected.append(100.0 if drop == 0 else min((h - 0.1) / drop, 100.0))
    assert to_floor == pytest.approx(expected)
    collapse = [m["probe/warning/collapse"] for m in seen]
    first = next(i for i, value in enumerate(expected) if value < 100)
    assert first == 6 and expected[first] == pytest.approx((2.0 - 0.03 - 0.1) / 0.02)  # 93.5 steps
    assert collapse == [0.0] * first + [1.0] * (len(drops) - first)
    lines = [r.getMessage() for r in caplog.records if "projected to reach the floor" in r.getMessage()]
    assert len(lines) == len(drops) - first and "in 93.5 training steps" in lines[0]
    assert all(m["probe/warning/disagree"] == 0.0 for m in seen)  # forecast and realised agree throughout


def test_a_forecast_disagreeing_for_consecutive_steps_warns_once_the_streak_is_long_enough(caplog):
    warning = EarlyWarning(SETTINGS)
    # forecast -0.05 vs realised +0.02, both ±0.01: z = 0.07 / (0.01·√2) = 4.95 > 2; one agreeing forecast resets
    pattern = ["off", "off", "on", "off", "off", "off", "off"]
    with caplog.at_level(logging.WARNING, logger="treetune_verl.forecast.early_warning"):
        seen = [warning.observe(_forecast(2.0, -0.05, 0.02 if p == "off" else -0.05)) for p in pattern]
    assert [m["probe/warning/disagree_streak"] for m in seen] == [1, 2, 0, 1, 2, 3, 4]
    assert [m["probe/warning/disagree"] for m in seen] == [0, 0, 0, 0, 0, 1, 1]
    assert seen[0]["probe/warning/disagreement_z"] == pytest.approx(0.07 / (0.01 * math.sqrt(2)))
    lines = [r.getMessage() for r in caplog.records if "disagree beyond their standard errors" in r.getMessage()]
    assert len(lines) == 2 and "for 3 consecutive forecasts" in lines[0]


def test_the_rate_averages_the_window_and_counts_every_optimizer_step():
    warning = EarlyWarning(WarningSettings(floor=0.0, horizon=1000, window=2))
    warning.observe(_forecast(1.0, -0.01, -0.01, steps=2.0))
    metrics = warning.observe(_forecast(0.98, -0.03, -0.03, steps=2.0))
    rate = (-0.01 * 2 + -0.03 * 2) / 2  # per training step: ΔH₁ x optimizer steps, mean over the window
    entropy = 0.98 - 0.06
    assert metrics["probe/warning/rate"] == pytest.approx(rate)
    assert metrics["probe/warning/steps_to_floor"] == pytest.approx(entropy / -rate)
    assert metrics["probe/warning/steps_to_floor_realised"] == pytest.approx(entropy / ((0.02 + 0.06) / 2))


def test_without_standard_errors_nothing_counts_as_disagreement_and_naive_is_used_alone():
    warning = EarlyWarning(SETTINGS)
    metrics = warning.observe(_forecast(2.0, -0.5, 0.5, se=math.nan, estimator="naive"))
    assert math.isnan(metrics["probe/warning/disagreement_z"]) and metrics["probe/warning/disagree_streak"] == 0
    with pytest.raises(KeyError, match="probe/optimizer_steps"):
        warning.observe({"probe/deltaH1/naive": 0.0, "probe/H_before": 1.0})


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"flor": 0.1}, r"unknown keys \['flor'\]"),
        ({"horizon": 0}, r"early_warning.horizon must be an integer >= 1"),
        ({"window": True}, r"early_warning.window must be an integer >= 1"),
        ({"floor": -1.0}, r"early_warning.floor must be a finite number >= 0"),
        ({"z": float("inf")}, r"early_warning.z must be a finite number >= 0"),
        ("on", r"must be a mapping"),
    ],
)
def test_settings_refuse_bad_values_naming_the_key(section, words):
    with pytest.raises(ValueError, match=words):
        warning_settings(section, "x.early_warning")
    assert warning_settings(None, "x") == WarningSettings()
    assert warning_settings({"floor": 0.5, "consecutive": 2}, "x").floor == 0.5


def test_the_plot_draws_the_projection_panel_when_the_run_logged_the_warning(tmp_path):
    """A collapsing series through the warning into verl's file-logger format: the PNG gets the projection panel
    (7 inches tall at 120 dpi instead of 4) and still plots a file without warning metrics in one panel."""
    import json
    import struct

    from treetune_verl.forecast.plot import plot_forecast

    warning, h, records = EarlyWarning(SETTINGS), 2.0, []
    for step, drop in enumerate([0.0, 0.0, 0.05, 0.1], start=1):
        metrics = _forecast(h, -drop, -drop)
        metrics |= warning.observe(metrics, log=False)
        records.append({"step": step, "data": metrics})
        h -= drop
    assert records[-1]["data"]["probe/warning/collapse"] == 1.0
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")

    def height(png) -> int:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        return struct.unpack(">II", data[16:24])[1]

    assert height(plot_forecast(path)) == 7 * 120
    path.write_text(
        "\n".join(
            json.dumps({**r, "data": {k: v for k, v in r["data"].items() if "warning" not in k}}) for r in records
        )
    )
    assert height(plot_forecast(path)) == 4 * 120
