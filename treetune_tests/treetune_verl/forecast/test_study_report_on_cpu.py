# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast's figures on made-up series: E's pooled token entropy and its standard errors against numpy, the
calibration figures of a run against their definitions written out here, the one-run PNG, and the study's report
opened in headless Chromium with every image decoded."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
import torch

from treetune_tests.headless_browser import needs_chromium, probed_dom
from treetune_verl.forecast.calibration import calibration, pooled, read_run, z_scores
from treetune_verl.forecast.plot import plot_forecast
from treetune_verl.forecast.study_report import write_report
from treetune_verl.forecast.token_entropy import TokenEntropyStats, ratio_and_se, ratio_moments
from treetune_verl.probe.teacher_forcing import TeacherForced


def test_pooled_token_entropy_and_its_standard_errors_match_numpy():
    gen = torch.Generator().manual_seed(0)
    B, G, R = 3, 2, 5
    mask = torch.rand(B, G, R, generator=gen) < 0.7
    mask[..., 0] = True
    h0, h_plus, h_minus = (torch.rand(B, G, R, generator=gen, dtype=torch.float64) * 3 for _ in range(3))
    lp = torch.zeros(B, G, R, dtype=torch.float64)
    stats = TokenEntropyStats.per_response(
        TeacherForced(lp, h0 * mask, mask),
        TeacherForced(lp, h_plus * mask, mask),
        TeacherForced(lp, h_minus * mask, mask),
    )
    m = mask.double().numpy().reshape(B * G, R)
    a, p, q = (t.numpy().reshape(B * G, R) * m for t in (h0, h_plus, h_minus))
    tokens = m.sum(1)

    def pooled(x, units=slice(None)):  # Σx/Σc and the delta-method SE over the responses, written out
        x, c = x[units], tokens[units]
        r, n = x.sum() / c.sum(), len(x)
        return r, math.sqrt(((x - r * c) ** 2).sum() / (n * (n - 1))) / c.mean()

    metrics = stats.metrics("t/", None, lambda t: t)
    tangent, change = ((p - q) / 2).sum(1), (p - a).sum(1)
    assert metrics["t/H_before"] == pytest.approx(pooled(a.sum(1))[0])
    assert (metrics["t/deltaH1"], metrics["t/deltaH1_se"]) == pytest.approx(pooled(tangent))
    assert (metrics["t/deltaH_realised"], metrics["t/deltaH_realised_se"]) == pytest.approx(pooled(change))
    assert metrics["t/deltaH_realised_first_step"] == metrics["t/deltaH_realised"]
    assert metrics["t/error_se"] == pytest.approx(pooled(change - tangent)[1])
    # held out: the forecast from each prompt's first response, the realised change from its second
    first, second = np.arange(B * G) % G == 0, np.arange(B * G) % G == 1
    assert (metrics["t/holdout/deltaH1"], metrics["t/holdout/deltaH1_se"]) == pytest.approx(pooled(tangent, first))
    assert (
        metrics["t/holdout/deltaH_realised_first_step"],
        metrics["t/holdout/deltaH_realised_first_step_se"],
    ) == pytest.approx(pooled(change, second))
    # the on-policy forecast: the tangent plus Σ_j ⟨∇log π_j, Δθ⟩ Σ_{k>j} (H_k − H̄_b), written out per response
    lp_plus, lp_minus = (torch.rand(B, G, R, generator=gen, dtype=torch.float64) for _ in range(2))
    stats = TokenEntropyStats.per_response(
        TeacherForced(lp, h0 * mask, mask),
        TeacherForced(lp_plus * mask, h_plus * mask, mask),
        TeacherForced(lp_minus * mask, h_minus * mask, mask),
    )
    tangent_lp = ((lp_plus - lp_minus) / 2 * mask).numpy().reshape(B * G, R)
    shift = np.zeros(B * G)
    for unit in range(B * G):
        b = unit // G
        h_bar = a[b * G : (b + 1) * G].sum() / tokens[b * G : (b + 1) * G].sum()
        real = np.flatnonzero(m[unit])
        for j in real:
            shift[unit] += tangent_lp[unit, j] * sum(a[unit, k] - h_bar for k in real if k > j)
    on_policy = stats.metrics("t/", None, lambda t: t)
    assert (on_policy["t/deltaH1_on_policy"], on_policy["t/deltaH1_on_policy_se"]) == pytest.approx(
        pooled(tangent + shift)
    )
    # moments summed over "ranks" give the pooled figure of the union
    half = ratio_moments(torch.tensor(tangent[:3]), torch.tensor(tokens[:3]))
    rest = ratio_moments(torch.tensor(tangent[3:]), torch.tensor(tokens[3:]))
    assert ratio_and_se(half + rest) == pytest.approx(pooled(tangent))
    assert math.isnan(ratio_and_se(ratio_moments(torch.tensor([1.0]), torch.tensor([2.0])))[1])  # one unit: no SE


def _softmax_share(step: int) -> float:
    return 0.2 if step % 2 else 0.6


def _record(step, rollout, forecast=None, realised=None, se=0.01, warning=0.0, **extra):
    data = {
        "timing_s/agent_loop/rollout_entropy/mean": rollout,
        "actor/entropy": rollout,
        "critic/score/mean": 0.2,
        "response_length/mean": 30.0,
        "actor/pg_loss": 0.0,
        "timing_s/update_actor": 10.0,
        "timing_s/probe": 3.0,
        **extra,
    }
    if forecast is not None:
        data |= {
            "probe/token/deltaH1": forecast,
            "probe/token/deltaH1_se": se,
            "probe/token/deltaH_realised_first_step": realised,
            "probe/token/deltaH_realised_first_step_se": se,
            "probe/token/error_se": se / 4,
            "probe/token/H_before": rollout,
            # held out: each half's value off by a fifth of the change, twice the SE
            "probe/token/holdout/deltaH1": forecast * 1.2,
            "probe/token/holdout/deltaH1_se": 2 * se,
            "probe/token/holdout/deltaH_realised_first_step": realised * 0.8,
            "probe/token/holdout/deltaH_realised_first_step_se": 2 * se,
            "probe/warning/collapse": warning,
            # the softmax forecast: a fifth (odd steps) or 3/5 (even steps) of the way from ΔH₁ to the realised change
            "probe/token/deltaH_softmax": forecast + _softmax_share(step) * (realised - forecast),
            "probe/token/deltaH_softmax_se": se,
            "probe/token/softmax_error_se": se / 4,
            "probe/token/holdout/deltaH_softmax": 1.2 * forecast,
            "probe/token/holdout/deltaH_softmax_se": 2 * se,
        }
    return {"step": step, "data": data}


# forecast, realised per step; the rollout entropy halves (2.0 -> < 1.0) at step 6, the warning first at step 3
SERIES = [(0.05, 0.06), (-0.02, -0.01), (-0.2, -0.25), (-0.3, -0.31), (0.001, -0.03), (-0.1, -0.06)]
ROLLOUT = [2.0, 2.05, 2.0, 1.8, 1.5, 0.9]
WARNING = [0, 0, 1, 1, 0, 1]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _run_records():
    records = [
        _record(i + 1, h, f, r, warning=float(w))
        for i, ((f, r), h, w) in enumerate(zip(SERIES, ROLLOUT, WARNING, strict=True))
    ]
    records.insert(0, {"step": 0, "data": {"val-core/reward": 0.1}})  # validation before training: not a step
    return records


def test_calibration_figures_follow_their_definitions(tmp_path):
    run = read_run(_write(tmp_path / "metrics.jsonl", _run_records()))
    figures = calibration(run)
    assert figures["steps"] == 6
    forecast, realised = np.array(SERIES).T
    for section, f, r, se in (
        ("same_states", forecast, realised, 0.01),
        ("held_out", 1.2 * forecast, 0.8 * realised, 0.02),
    ):
        got = figures[section]
        assert got["forecast_steps"] == 6
        assert got["pearson"] == pytest.approx(np.corrcoef(f, r)[0, 1])
        clear = np.abs(r) > 2 * se
        assert got["clear_steps"] == int(clear.sum())
        assert got["sign_agreement"] == pytest.approx(np.mean(np.sign(f[clear]) == np.sign(r[clear])))
        assert got["coverage_combined"] == pytest.approx(np.mean(np.abs((r - f) / math.hypot(se, se)) <= 2))
        assert got["median_forecast_se"] == se and got["median_abs_realised"] == pytest.approx(np.median(np.abs(r)))
    same = figures["same_states"]
    assert same["clear_steps"] == 5 and same["sign_agreement"] == pytest.approx(0.8)  # all but step 2; 4 of 5 agree
    assert same["coverage_paired"] == pytest.approx(np.mean(np.abs((realised - forecast) / 0.0025) <= 2))
    assert "coverage_paired" not in figures["held_out"]
    # the softmax forecast's predictive SE: the paired one and its distance from ΔH₁, in quadrature
    softmax = forecast + np.array([_softmax_share(step) for step in range(1, 7)]) * (realised - forecast)
    predictive = np.sqrt(0.0025**2 + (softmax - forecast) ** 2)
    got = figures["softmax_same_states"]
    assert got["pearson"] == pytest.approx(np.corrcoef(softmax, realised)[0, 1])
    assert got["coverage_predictive"] == pytest.approx(np.mean(np.abs(realised - softmax) <= 2 * predictive))
    assert got["coverage_predictive"] == 0.5  # outside on odd steps (error 0.8 of the gap, SE 0.2), inside on even
    assert got["median_predictive_se"] == pytest.approx(np.median(predictive))
    assert (
        "coverage_predictive" not in figures["same_states"] and "coverage_predictive" not in figures["softmax_held_out"]
    )
    with pytest.raises(ValueError, match="predictive standard error is the softmax forecast's"):
        z_scores(run, "predictive")
    # pooled over two runs: the figures of the steps of both, as one series
    both = pooled([run, run[:3]])
    f2, r2 = np.concatenate([softmax, softmax[:3]]), np.concatenate([realised, realised[:3]])
    assert both["softmax_same_states"]["forecast_steps"] == 9
    assert both["softmax_same_states"]["pearson"] == pytest.approx(np.corrcoef(f2, r2)[0, 1])
    assert (figures["collapse_step"], figures["first_warning_step"], figures["warning_lead"]) == (6, 3, 3)
    assert figures["warning_steps"] == 3 and figures["probe_over_update_actor"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="metrics.jsonl:2: not a verl file-logger record"):
        read_run(_write(tmp_path / "metrics.jsonl", [_run_records()[1], {"no": "step"}]))


def test_the_one_run_plot_has_both_panels(tmp_path):
    png = plot_forecast(_write(tmp_path / "metrics.jsonl", _run_records()))
    data = png.read_bytes()
    assert png.name == "entropy_forecast.png" and data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (7 * 120, 7 * 120)
    with pytest.raises(ValueError, match="no step with probe/token/deltaH1"):
        plot_forecast(_write(tmp_path / "metrics.jsonl", [_record(1, 2.0)]))


def test_issue_46s_five_arms_each_drawn_and_the_controlled_arms_band_kept(tmp_path, monkeypatch):
    """The study's five arms (issue 46): every arm reaches every multi-arm plot (the palette had four colours and
    ``zip`` left the fifth off), and the controlled arm's band and coefficient reach ``study.json``."""
    import matplotlib.axes

    band = {"control/band_low": 1.0, "control/band_high": 1.8, "control/coefficient": 0.05, "control/cost_ratio": 0.3}
    arms = {
        arm: _write(
            tmp_path / f"{arm}.jsonl",
            [_record(i, 1.5, 0.01, 0.02, **(band if arm == "controlled" else {})) for i in range(1, 4)],
        )
        for arm in ("collapsing", "stable", "controlled", "clip_cov", "kl_cov")
    }
    labels = []
    plot = matplotlib.axes.Axes.plot

    def recording_plot(self, *args, label=None, **kwargs):
        labels.append(label)
        return plot(self, *args, label=label, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording_plot)
    write_report(arms, tmp_path / "report")
    assert all(labels.count(arm) >= 2 for arm in arms), labels  # reward and length panels, every arm
    study = json.loads((tmp_path / "report" / "study.json").read_text())
    steps = study["arms"]["controlled"]["steps"]
    assert [(s["band_low"], s["band_high"], s["control_coefficient"]) for s in steps] == [(1.0, 1.8, 0.05)] * 3
    assert study["arms"]["stable"]["steps"][0]["band_low"] is None  # no controller: null, not a band


@needs_chromium
def test_the_report_opens_in_headless_chromium_with_every_image(tmp_path):
    """Chromium loads report.html from disk; a script appended to a copy counts the images that decoded
    (naturalWidth > 0) and the table's arms, and writes the counts into the DOM that --dump-dom prints."""
    collapsing = _write(tmp_path / "collapsing.jsonl", _run_records())
    stable = _write(tmp_path / "stable.jsonl", [_record(i, 2.0, 0.001, 0.002) for i in range(1, 5)])
    page = write_report(
        {"collapsing": collapsing, "stable": stable}, tmp_path / "report", pools={"both": ["collapsing", "stable"]}
    )
    study = json.loads((tmp_path / "report" / "study.json").read_text())
    assert study["pools"]["both"]["softmax_same_states"]["forecast_steps"] == 10  # 6 + 4 steps
    assert study["pools"]["both"]["same_states"]["forecast_steps"] == 10
    with pytest.raises(ValueError, match="pool 'x': arms \\['typo'\\] not among"):
        write_report({"collapsing": collapsing}, tmp_path / "r2", pools={"x": ["typo"]})
    assert study["arms"]["collapsing"]["calibration"]["warning_lead"] == 3
    assert study["arms"]["stable"]["calibration"]["collapse_step"] is None  # null, not NaN, in the JSON
    assert len(study["arms"]["stable"]["steps"]) == 4
    result = probed_dom(
        page,
        "images=${document.images.length} loaded=${ok} arms=${document.querySelectorAll('table tr:first-child th')"
        ".length - 1}",
    )
    assert 'data-probe="images=4 loaded=4 arms=3"' in result.stdout, result.stderr[-2000:]
