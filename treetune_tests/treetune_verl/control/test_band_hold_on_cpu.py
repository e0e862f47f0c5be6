# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``control/band_hold.py``: issue 46's figures from runs' ``metrics.jsonl`` (verl's file-logger records written
here), each expected value counted by hand in the test."""

from __future__ import annotations

import json
import math

import pytest

from treetune_verl.control import band_hold as bh
from treetune_verl.forecast.calibration import read_run

ENTROPY, REWARD, LENGTH = "timing_s/agent_loop/rollout_entropy/mean", "critic/score/mean", "response_length/mean"


def _write(path, entropies, rewards, band=None, costs=None):
    with path.open("w") as f:
        f.write(json.dumps({"step": 0, "data": {"val-core/x/reward/mean@1": 0.5}}) + "\n")  # validation only: skipped
        for i, (h, r) in enumerate(zip(entropies, rewards, strict=True)):
            data = {ENTROPY: h, REWARD: r, LENGTH: 20.0 - 2 * i, "actor/pg_loss": 0.1}
            # verl's update_actor timer contains the forecast's seconds: probe/cost_ratio is over the rest
            data.update({"timing_s/probe": 3.0 + i, "timing_s/update_actor": 10.0})
            data["probe/cost_ratio"] = (3.0 + i) / (10.0 - (3.0 + i))
            if band is not None:
                data.update({"control/band_low": band[0], "control/band_high": band[1]})
            if costs is not None:
                data["control/cost_ratio"] = costs[i]
            f.write(json.dumps({"step": i + 1, "data": data}) + "\n")
    return path


def test_band_hold_counts_the_steps_from_step_3_inside_the_band(tmp_path):
    # steps 1-2 outside (not judged); from step 3: 1.5 in, 0.9 out by 0.1, 1.0 (edge) in, 2.0 out by 0.2, 1.2 in
    entropies = [2.0, 1.9, 1.5, 0.9, 1.0, 2.0, 1.2]
    rewards = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    run = read_run(_write(tmp_path / "c.jsonl", entropies, rewards, band=(1.0, 1.8), costs=[0.3, 0.5, 0.4] + [0.2] * 4))
    assert bh.logged_band(run) == (1.0, 1.8)
    r = bh.band_hold(run, 1.0, 1.8)
    assert r.steps == 5 and r.band_hold == pytest.approx(3 / 5)
    assert r.overshoot == pytest.approx(0.2)
    assert (r.start, r.lowest) == (2.0, 0.9) and r.lowest_share == pytest.approx(0.45)
    assert r.final_reward == pytest.approx((0.3 + 0.4 + 0.5 + 0.6 + 0.7) / 5)
    assert r.control_cost_ratio == pytest.approx(0.2)  # the median of 0.3, 0.5, 0.4, 0.2 x 4
    assert r.probe_cost_ratio == pytest.approx(1.5)  # the median of 3/7, 4/6, 5/5, 6/4, ... (not of 3/10, 4/10, ...)
    assert r.length_start == 20.0 and r.final_length == pytest.approx((16 + 14 + 12 + 10 + 8) / 5)
    table = bh.markdown_table({"controlled": r}, 1.0, 1.8, 3)
    assert "| controlled | 60% (3/5) | 0.20 | 2.00 → 0.900 (45%) | 0.500 | 20.0 → 12.0 | 0.20 | 1.50 |" in table


def test_an_arm_without_the_controller_is_judged_on_the_controlled_arms_band(tmp_path, capsys):
    controlled = _write(tmp_path / "c.jsonl", [1.5] * 4, [0.5] * 4, band=(1.0, 1.8), costs=[0.3] * 4)
    stock = _write(tmp_path / "s.jsonl", [1.5, 1.2, 0.5, 0.1], [0.5] * 4)
    out = tmp_path / "rows.json"
    assert bh.main([f"controlled={controlled}", f"stock={stock}", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rows["band"] == {"low": 1.0, "high": 1.8, "first_step": 3}
    assert rows["arms"]["controlled"]["band_hold"] == 1.0 and rows["arms"]["stock"]["band_hold"] == 0.0
    assert rows["arms"]["stock"]["overshoot"] == pytest.approx(0.9) and rows["arms"]["stock"]["lowest_share"] < 0.1
    assert rows["arms"]["stock"]["control_cost_ratio"] is None or math.isnan(
        rows["arms"]["stock"]["control_cost_ratio"]
    )
    assert "| stock | 0% (0/2) |" in capsys.readouterr().out


def test_bad_input_is_refused_by_name(tmp_path):
    stock = read_run(_write(tmp_path / "s.jsonl", [1.5, 1.2, math.nan], [0.5] * 3))
    with pytest.raises(ValueError, match=r"steps \[3\] logged no rollout entropy"):
        bh.band_hold(stock, 1.0, 1.8)
    with pytest.raises(ValueError, match="no step from step 5"):
        bh.band_hold(stock, 1.0, 1.8, first_step=5)
    with pytest.raises(ValueError, match="is empty"):
        bh.band_hold(stock, 1.8, 1.0)
    with pytest.raises(ValueError, match="found none"):
        bh.logged_band(stock)
    moved = read_run(_write(tmp_path / "m.jsonl", [1.5, 1.4], [0.5] * 2, band=(1.0, 1.8)))
    moved = [moved[0], type(moved[1])(**{**moved[1].__dict__, "band_low": 0.9})]
    with pytest.raises(ValueError, match="the one band"):
        bh.logged_band(moved, first_step=1)
    # a target_fraction band moves over its reference updates and is judged on the one it settled on
    assert bh.logged_band(moved, first_step=2) == (0.9, 1.8)
    with pytest.raises(SystemExit):
        bh.main([f"stock={tmp_path / 's.jsonl'}"])  # no arm with a band and no --band
