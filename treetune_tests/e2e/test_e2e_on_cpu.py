# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's own GRPO trainer (``python -m verl.trainer.main_ppo``) for 2 steps on CPU with the tiny random Qwen2:
real Ray, FSDP2 actor, sglang CPU Engine behind our replica/server, selected only by the README override block.

Runs ``treetune_tests/e2e/test_entropy_e2e.sh`` (which checks the acceptance metrics itself) and re-reads its
``metrics.jsonl``. About 2-3 minutes on 2 cores. Output: ``outputs/e2e-test-tiny/`` (``train.log``, ``metrics.jsonl``).
"""

from __future__ import annotations

import math

import pytest
import torch

from treetune_tests.e2e.check_metrics import (
    ENTROPY_DIFF,
    ENTROPY_MEAN,
    GRAD_NORM,
    PEARSON,
    PG_LOSS,
    PROBS_DIFF,
    check,
    read_steps,
)
from treetune_tests.e2e.script import REPO_ROOT, run_training

WORKDIR = REPO_ROOT / "outputs" / "e2e-test-tiny"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_grpo_two_steps_tiny_model_on_cpu():
    env = {"E2E_MODEL": "tiny", "E2E_STEPS": "2", "E2E_WORKDIR": str(WORKDIR)}
    result = run_training(env, timeout=900)  # exit 0, nothing of the trainer's session left
    assert "OK: 2 step(s)" in result.stdout

    steps = read_steps(WORKDIR / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
    assert check(steps, min_steps=2, max_probs_diff=1e-3, min_pearson=0.999, max_entropy_diff=1e-3) == []
    for metrics in steps:
        assert math.isfinite(metrics[PG_LOSS]) and metrics[GRAD_NORM] > 0 and metrics[ENTROPY_MEAN] > 0
        assert metrics[PROBS_DIFF] <= 1e-3 and metrics[PEARSON] >= 0.999
        # the sampler's entropy of each token against the actor's own (fp32 on both sides here)
        assert metrics[ENTROPY_DIFF] <= 1e-3 and metrics["rollout_entropy/actor_abs_diff/max"] <= 1e-2
        assert metrics["timing_s/agent_loop/rollout_entropy/rows_without_entropy"] == 0
    # the override block selected our classes: the server and the workers are ours
    text = (WORKDIR / "train.log").read_text()
    assert "EntropySGLangHttpServer" in text and "EntropyAgentLoopWorker" in text
