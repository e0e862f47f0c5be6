# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The live entropy forecast in verl 0.7.1's own GRPO trainer on CPU (``E2E_FORECAST`` of ``test_entropy_e2e.sh``):
the script's arguments.

``E2E_FORECAST=k`` writes ``+treetune_forecast=entropy_forecast`` (every k steps) and the actor entry point; the script
checks that every step logs ``probe/deltaH1/{naive,rb_residual}``, ``probe/deltaH_realised`` (and the first step's),
``timing_s/probe`` and ``probe/cost_ratio``, finite (``check_metrics --forecast-every``), and writes
``entropy_forecast.png``. The GRPO run that trains with it every step is the variants' full / resume
pair (``test_e2e_variants_on_cpu.py``, both stacks), which re-reads them.
"""

from __future__ import annotations

from treetune_tests.e2e.script import run_script


def test_forecast_arguments(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    args = run_script({**env, "E2E_FORECAST": "2"}, timeout=300).stdout.splitlines()
    assert "+treetune_forecast=entropy_forecast" in args
    assert "actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup" in args
    assert "actor_rollout_ref.rollout.custom.entropy_forecast.every=2" in args
    stock = run_script({**env, "E2E_FORECAST": "1", "E2E_BLOCK": "0"}, timeout=300).stdout.splitlines()
    assert "hydra.searchpath=[pkg://treetune_verl.config]" in stock and "+treetune=rollout_entropy" not in stock
