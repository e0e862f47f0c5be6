# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Stock verl 0.9.1 GRPO (``python -m verl.trainer.main_ppo``: its default V1 trainer on TransferQueue, Ray, an FSDP2
engine-worker actor, an sglang 0.5.12 rollout server) for 2 steps on CPU with the tiny random Qwen2.

What the current stack's trainer side builds on: the CPU runtime patches of ``tools/cpu_shims/verl_cpu`` for verl 0.9.1
(the ``cpu`` platform among them) and the e2e script's current-stack settings, without the override block
(``E2E_BLOCK=0``; the block on verl 0.9.1 is the next increment). Runs ``test_entropy_e2e.sh``, which checks every
step's metrics itself, and re-reads its ``metrics.jsonl``. About 4 minutes on 2 cores. Output:
``outputs/e2e-current-stock-tiny/``.
"""

from __future__ import annotations

import importlib.metadata
import math

import pytest
import torch

from treetune_tests.e2e.check_metrics import GRAD_NORM, PEARSON, PG_LOSS, PROBS_DIFF, check, read_steps
from treetune_tests.e2e.script import REPO_ROOT, run_script, run_training

WORKDIR = REPO_ROOT / "outputs" / "e2e-current-stock-tiny"

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")


def test_the_override_block_is_refused_on_verl_0_9_1_until_it_runs_there(tmp_path):
    result = run_script({"E2E_MODEL": "tiny", "E2E_PRINT_ARGS": "1", "E2E_WORKDIR": str(tmp_path)}, timeout=300)
    assert result.returncode == 2
    assert "the override block does not run on verl 0.9.1 yet" in result.stderr and "E2E_BLOCK=0" in result.stderr


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_stock_verl_0_9_1_grpo_two_steps_on_cpu():
    env = {"E2E_MODEL": "tiny", "E2E_STEPS": "2", "E2E_BLOCK": "0", "E2E_WORKDIR": str(WORKDIR)}
    result = run_training(env, timeout=1200)  # exit 0, nothing of the trainer's session left
    assert "OK: 2 step(s)" in result.stdout

    steps = read_steps(WORKDIR / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
    assert check(steps, min_steps=2, max_probs_diff=1e-3, min_pearson=0.999, entropy=False) == []
    for metrics in steps:
        assert math.isfinite(metrics[PG_LOSS]) and metrics[GRAD_NORM] > 0
        # sglang serves the weights the actor computes with: after step 1's update too (the weight sync works)
        assert metrics[PROBS_DIFF] <= 1e-3 and metrics[PEARSON] >= 0.999
