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

import pytest

from treetune_tests.e2e.forecast_study import ARM_BLOCKS, COMMON, arm_overrides
from treetune_tests.e2e.script import run_script

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


@pytest.mark.parametrize("arm", sorted(ARM_BLOCKS))
def test_issue_46s_arms_compose_with_verls_config_and_ours(arm, tiny_model_dir, tmp_path):
    """Each arm's block after the e2e script's arguments (the forecast on, as every arm runs) composes in the
    installed verl's trainer config; the loss modes reach verl's policy loss, the controller's block our settings."""
    import verl
    from hydra import compose, initialize_config_dir

    from treetune_verl.control.settings import control_settings

    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_FORECAST": "1"}
    result = run_script({**env, "E2E_WORKDIR": str(tmp_path)}, timeout=300)
    assert result.returncode == 0, result.stderr
    overrides = [*result.stdout.splitlines(), *arm_overrides(1e-4, None, None, rollout_n=4), *ARM_BLOCKS[arm]]
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    settings = control_settings(rollout)
    if arm in ("controlled", "reactive"):
        assert (settings.target_fraction, settings.width) == (0.8, 0.8) and actor.policy_loss.loss_mode == "vanilla"
        assert settings.rule == ("forecast" if arm == "controlled" else "reactive")
    else:
        assert settings is None and actor.policy_loss.loss_mode == arm
    if arm == "clip_cov":
        assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.policy_loss.clip_cov_ratio) == (1, 1, 0.0002)
    if arm == "kl_cov":
        assert (actor.policy_loss.kl_cov_ratio, actor.policy_loss.ppo_kl_coef) == (0.002, 1)


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
