# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``control/report.py``: the controller's section of the study report, from runs' ``metrics.jsonl`` written here
(verl's file-logger records): the decisions read back as logged, every arm judged on the controlled arm's band with
the shares counted by hand, the plot only where an arm ran the controller."""

from __future__ import annotations

import json

import pytest

from treetune_verl.control.report import band_hold_html, control_section, controlled_arms
from treetune_verl.forecast.calibration import read_run

ENTROPY, REWARD, LENGTH = "timing_s/agent_loop/rollout_entropy/mean", "critic/score/mean", "response_length/mean"
DECISION = {
    "control/aim": 1.3,
    "control/predicted_before": 0.9,
    "control/predicted_after": 1.25,
    "control/predicted_change": 0.35,
    "control/realised_heldout": 0.3,
    "control/realised_heldout_se": 0.05,
    "control/b": 2.0,
    "control/coefficient": 0.175,
}


def _write(path, entropies, band=None):
    with path.open("w") as f:
        for i, h in enumerate(entropies):
            data = {ENTROPY: h, REWARD: 0.1 * i, LENGTH: 10.0, "actor/pg_loss": 0.1}
            if band is not None:
                data.update({"control/band_low": band[0], "control/band_high": band[1], **DECISION})
            f.write(json.dumps({"step": i + 1, "data": data}) + "\n")
    return path


def test_decisions_are_read_as_logged(tmp_path):
    step = read_run(_write(tmp_path / "c.jsonl", [1.5, 1.4], band=(1.0, 1.8)))[1]
    assert (step.control_aim, step.control_predicted_before, step.control_predicted_after) == (1.3, 0.9, 1.25)
    assert (step.control_predicted_change, step.control_realised, step.control_realised_se) == (0.35, 0.3, 0.05)
    assert (step.control_sensitivity, step.control_coefficient) == (2.0, 0.175)


def test_every_arm_is_judged_on_the_controlled_arms_band(tmp_path):
    runs = {
        # from step 3: 1.5 in, 0.9 out, 1.0 (edge) in, 2.0 out: 2 of 4
        "stock": read_run(_write(tmp_path / "s.jsonl", [2.0, 1.9, 1.5, 0.9, 1.0, 2.0])),
        # 1.2, 1.3, 1.7, 1.1 all in: 4 of 4 (its band judges both)
        "controlled": read_run(_write(tmp_path / "c.jsonl", [2.0, 1.9, 1.2, 1.3, 1.7, 1.1], band=(1.0, 1.8))),
    }
    assert controlled_arms(runs) == ["controlled"]
    page = band_hold_html(runs)
    assert "band [1.00, 1.80] held, steps ≥ 3" in page
    assert "<tr><th>stock</th><td>50% (2/4)</td><td>0.20</td>" in page  # 2.0 is 0.2 above the band
    assert "<tr><th>controlled</th><td>100% (4/4)</td><td>0.00</td>" in page
    notes, plots = control_section(runs, tmp_path)
    assert notes == page and list(plots.values()) == [tmp_path / "control_decisions.png"]
    assert (tmp_path / "control_decisions.png").stat().st_size > 0


def test_no_section_without_a_controlled_arm(tmp_path):
    runs = {"stock": read_run(_write(tmp_path / "s.jsonl", [2.0, 1.9, 1.5]))}
    assert control_section(runs, tmp_path) == ("", {})
    assert not (tmp_path / "control_decisions.png").exists()


def test_a_band_that_moved_cannot_judge(tmp_path):
    path = _write(tmp_path / "c.jsonl", [2.0, 1.9, 1.2, 1.3], band=(1.0, 1.8))
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    last["data"]["control/band_low"] = 0.9
    path.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    with pytest.raises(ValueError, match="expected the one band"):
        band_hold_html({"controlled": read_run(path)})
