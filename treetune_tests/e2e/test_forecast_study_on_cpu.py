# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``make study``'s job end to end on the tiny random Qwen2 (one arm of 2 GRPO steps: verl's own ``main_ppo`` with
the rollout-entropy and forecast blocks, E's records on): each step printed as it lands, the report, its PNGs and
``study.json`` written from the run's metrics, one record file per forecast. The SmolLM2 arms' figures are in
``treetune_specs/2026-11-28-forecast-calibration.md``; here the job's path, not its numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from treetune_tests.e2e.forecast_study import COMMON, arm_overrides

ROOT = Path(__file__).resolve().parents[2]


def test_arm_overrides_set_the_learning_rate_warm_up_budget_and_records(tmp_path):
    overrides = arm_overrides(1e-5, None, tmp_path)
    assert overrides[: len(COMMON)] == COMMON and "actor_rollout_ref.actor.optim.lr=1e-05" in overrides
    assert "actor_rollout_ref.rollout.custom.entropy_forecast.eval_share=1.0" in overrides
    assert f"+actor_rollout_ref.rollout.custom.entropy_forecast.record_dir={tmp_path}" in overrides
    assert not any(o.startswith("data.seed") for o in overrides)  # verl's prompt order unless --seed
    assert "data.seed=3" in arm_overrides(1e-4, 3, None)
    assert "actor_rollout_ref.rollout.n=4" in arm_overrides(1e-4, None, None, rollout_n=4)
    assert not any(o.startswith("actor_rollout_ref.rollout.n=") for o in arm_overrides(1e-4, None, None))


def test_the_study_job_runs_an_arm_and_writes_its_report(tmp_path):
    command = [sys.executable, str(ROOT / "treetune_tests/e2e/forecast_study.py"), "--model", "tiny"]
    command += ["--arms", "stable", "--stable-steps", "2", "--rollout-n", "2", "--record", "--root", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("[study stable] step")]
    assert [line.split()[3] for line in lines] == ["1", "2"] and all("forecast" in line for line in lines)
    study = json.loads((tmp_path / "study.json").read_text())
    steps = study["arms"]["stable"]["steps"]
    assert [s["step"] for s in steps] == [1, 2] and all(s["forecast"] is not None for s in steps)
    assert study["arms"]["stable"]["calibration"]["same_states"]["forecast_steps"] == 2
    assert all((tmp_path / name).stat().st_size > 0 for name in ("report.html", "entropy.png", "calibration.png"))
    assert len(list((tmp_path / "stable" / "records").glob("forecast_*_rank0.pt"))) == 2
