# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The live entropy forecast in verl 0.7.1's own GRPO trainer on CPU (``E2E_FORECAST`` of ``test_entropy_e2e.sh``).

The tiny e2e run with ``+treetune_forecast=entropy_forecast`` (every step): the script checks that every step logs
``probe/deltaH1/{naive,rb_residual}``, ``probe/deltaH_realised`` (and the first step's), ``timing_s/probe`` and
``probe/cost_ratio``, finite (``check_metrics --forecast-every``), and writes ``entropy_forecast.png``; the test
re-reads them: one optimizer step per update (so the realised change of the update is the first step's), and the plot is a PNG.
"""

from __future__ import annotations

import math

import pytest
import torch

from treetune_tests.e2e.check_metrics import FORECAST_KEYS, GRAD_NORM, read_steps, training_steps
from treetune_tests.e2e.script import REPO_ROOT, run_script

WORKDIR = REPO_ROOT / "outputs" / "e2e-test-forecast"


def test_forecast_arguments(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    args = run_script({**env, "E2E_FORECAST": "2"}, timeout=300).stdout.splitlines()
    assert "+treetune_forecast=entropy_forecast" in args
    assert "actor_rollout_ref.model.external_lib=treetune_verl.trainer.actor_setup" in args
    assert "actor_rollout_ref.rollout.custom.entropy_forecast.every=2" in args
    stock = run_script({**env, "E2E_FORECAST": "1", "E2E_BLOCK": "0"}, timeout=300).stdout.splitlines()
    assert "hydra.searchpath=[pkg://treetune_verl.config]" in stock and "+treetune=rollout_entropy" not in stock


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_grpo_with_the_entropy_forecast_logs_forecast_and_outcome_every_step():
    env = {"E2E_MODEL": "tiny", "E2E_FORECAST": "1", "E2E_STEPS": "2", "E2E_WORKDIR": str(WORKDIR)}
    result = run_script(env, timeout=1500)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    steps = training_steps(read_steps(WORKDIR / "metrics.jsonl"))
    assert [m["step"] for m in steps] == [1, 2]
    for metrics in steps:
        assert all(math.isfinite(metrics[key]) for key in FORECAST_KEYS)
        assert metrics[GRAD_NORM] > 0
        assert metrics["probe/optimizer_steps"] == 1
        assert metrics["probe/deltaH_realised_first_step"] == metrics["probe/deltaH_realised"]
        assert metrics["timing_s/probe"] > 0 and metrics["probe/step_norm"] > 0
    assert (WORKDIR / "entropy_forecast.png").read_bytes()[:4] == b"\x89PNG"
    print(result.stdout[-2000:])
