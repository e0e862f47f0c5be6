# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Replaying the early warning over a run's ``metrics.jsonl``: the steps, collapse and lead written out here for a
synthetic run (rates of 0 %, then 1 %, 5 %, 5 % per step: the rule warns from the first 5 %; entropy below ½ at step 5),
the settings applied (``on_policy=true``), a typo in them refused, steps without a forecast skipped."""

from __future__ import annotations

import json

import pytest

from treetune_verl.forecast.early_warning import WarningSettings
from treetune_verl.forecast.replay_warning import main, replay


def _record(step, entropy, fall=None, on_policy=None):
    data = {"timing_s/agent_loop/rollout_entropy/mean": entropy, "actor/pg_loss": 0.0}
    if fall is not None:
        data |= {
            "probe/token/H_before": 1.0,
            "probe/token/deltaH1": -fall,
            "probe/token/deltaH1_se": 0.001,
            "probe/token/deltaH_realised": -fall,
            "probe/token/deltaH_realised_first_step": -fall,
            "probe/token/error_se": 0.001,
            "probe/optimizer_steps": 1.0,
        }
        if on_policy is not None:
            data |= {"probe/token/deltaH1_on_policy": on_policy, "probe/token/deltaH1_on_policy_se": 0.001}
    return json.dumps({"step": step, "data": data})


@pytest.fixture
def run(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        _record(1, 2.0, 0.0),  # skipped by the rule (the first forecast)
        _record(2, 1.9, 0.01, on_policy=-0.2),  # the tangent 1 %: quiet; on-policy 20 %: warns
        _record(3, 1.5),  # no forecast this step
        _record(4, 1.2, 0.05),
        _record(5, 0.9, 0.05),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_replay_gives_the_rules_warnings_the_collapse_and_the_lead(run):
    both = replay(run, WarningSettings(on_policy=True))
    assert both.collapse_step == 5 and both.warned == (2, 4, 5) and both.lead == 3
    tangent = replay(run, WarningSettings())
    assert tangent.warned == (4, 5) and tangent.lead == 1


def test_the_command_line_applies_and_checks_the_settings(run, capsys):
    main([str(run), "--set", "on_policy=true"])
    assert "collapse step 5, warnings at [2, 4, 5], lead 3" in capsys.readouterr().out
    with pytest.raises(ValueError, match="horizn: unknown key; did you mean 'horizon'"):
        main([str(run), "--set", "horizn=10"])
