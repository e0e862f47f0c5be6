# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main job's report: summaries over repeats, per-estimator entries and the printed table (hand-made inputs)."""

from __future__ import annotations

import math

import pytest

from treetune_verl.probe.report import agreement, estimator_entries, format_table, per_repeat_rows, std_ratio, summary


def _probe(deltaH1: float, units: str = "nats per L_max token", **extra) -> dict:
    return {"deltaH1": deltaH1, "bars_dot": deltaH1 * 10, "norm_X": 2.0, "target_units": units, **extra}


PROBES = {
    "naive": [_probe(1.0, deltaH_true=0.5, baseline_mode="leave_one_out"), _probe(5.0, deltaH_true=1.5)],
    "rb_residual": [
        _probe(2.0, "nats per sequence", deltaH_true=1.0, baseline_mode="residual_mu"),
        _probe(4.0, "nats per sequence", deltaH_true=3.0, baseline_mode="residual_mu"),
    ],
}


def test_summary_of_one_and_of_several_values():
    assert summary([1.0, 3.0, 8.0]) == {
        "mean": 4.0,
        "std": math.sqrt(13.0),
        "sem": math.sqrt(13.0) / math.sqrt(3.0),
        "median": 3.0,
    }
    assert summary([2.5]) == {"mean": 2.5, "std": None, "sem": None, "median": 2.5}


def test_agreement_is_paired_and_uses_two_standard_errors():
    # differences 1, 3 (mean 2, std sqrt(2), sem 1): |2| <= 2·1 agrees; differences 1, 1.2: sem 0.1, |1.1| > 0.2 not
    assert agreement([2.0, 5.0], [1.0, 2.0]) == {
        "mean": 2.0,
        "std": math.sqrt(2.0),
        "sem": 1.0,
        "median": 2.0,
        "agrees": True,
    }
    assert agreement([2.0, 3.2], [1.0, 2.0])["agrees"] is False
    # what both share (the E batch's own noise, spread 10 here) cancels: differences 0.5, -0.5, 0 agree ...
    assert agreement([10.5, -10.5, 0.0], [10.0, -10.0, 0.0])["agrees"] is True
    # ... and a constant offset without noise is a bias
    assert agreement([10.5, -9.5, 0.5], [10.0, -10.0, 0.0])["agrees"] is False
    assert agreement([1.0], [0.0])["agrees"] is None


def test_estimator_entries_and_std_ratio():
    entries = estimator_entries(PROBES)
    assert entries["naive"] == {
        "units": "nats per L_max token",
        "deltaH1": {"mean": 3.0, "std": math.sqrt(8.0), "sem": 2.0, "median": 3.0},
        "deltaH_true": {"mean": 1.0, "std": math.sqrt(0.5), "sem": 0.5, "median": 1.0},
        "deltaH1_minus_true": {
            "mean": 2.0,
            "std": math.sqrt(4.5),
            "sem": pytest.approx(1.5),
            "median": 2.0,
            "agrees": True,
        },
    }
    assert entries["rb_residual"]["units"] == "nats per sequence"
    assert entries["rb_residual"]["baseline"] == "residual_mu"
    assert entries["rb_residual"]["deltaH_true"]["mean"] == 2.0
    assert std_ratio(entries) == 2.0  # sqrt(8) / sqrt(2)
    assert std_ratio({"naive": entries["naive"]}) is None
    one_repeat = estimator_entries({name: probes[:1] for name, probes in PROBES.items()})
    assert std_ratio(one_repeat) is None


def test_per_repeat_rows():
    rows = per_repeat_rows(PROBES)
    assert rows == [
        {
            "repeat": 0,
            "naive": {"bars_dot": 10.0, "deltaH1": 1.0, "norm_X": 2.0},
            "rb_residual": {"bars_dot": 20.0, "deltaH1": 2.0, "norm_X": 2.0},
        },
        {
            "repeat": 1,
            "naive": {"bars_dot": 50.0, "deltaH1": 5.0, "norm_X": 2.0},
            "rb_residual": {"bars_dot": 40.0, "deltaH1": 4.0, "norm_X": 2.0},
        },
    ]


def test_format_table_lines():
    entries = estimator_entries(PROBES)
    results = {
        "model": "tiny",
        "device": "cpu",
        "config": {"batch": {"B_E": 2, "B_U": 3, "G": 4}, "run": {"repeats": 2}, "optimizer": {"name": "adamw"}},
        "lr": 1e-6,
        "optimizer_state_step": 4,
        "preconditioner": "optimizer",
        "params_without_state": 0,
        "params": 7,
        "mean_reward_U": 0.25,
        "timing_median_s": {"sample_s": 1.0, "Y_s": 2.0, "X_s[naive]": 3.0, "X_s[rb_residual]": 4.0},
        "estimators": entries,
        "std_ratio_naive_over_rb": std_ratio(entries),
        "cui_covariance_deltaH": [-1e-6, -3e-6],
        "json_path": "out/probe_results.json",
    }
    lines = format_table(results).splitlines()
    assert lines[0] == (
        "entropy probe: tiny on cpu, B_E=2 B_U=3 G=4, repeats=2, optimizer=adamw lr=1e-06 (P=optimizer, state after 4 "
        "steps, 0/7 params without state), mean reward on U=0.25"
    )
    assert lines[2].split() == [
        "naive",
        "+3.000e+00",
        "2.828e+00",
        "+1.000e+00",
        "+2.00e+00",  # ΔH₁ − ΔH_true per repeat: 0.5, 3.5; mean 2, 2·sem = 3
        "±",
        "3.0e+00",
        "yes",
        "3.00",
        "nats",
        "per",
        "L_max",
        "token",
    ]
    assert lines[3].startswith("rb_residual (residual_mu)")
    assert lines[4] == "spread ratio std(naive)/std(rb_residual) = 2.00"
    assert lines[5] == "time per phase (median s): sample_s=1.00, Y_s=2.00"
    assert ": -2.000e-06 nats per token" in lines[6]
    assert lines[7] == "results: out/probe_results.json"
