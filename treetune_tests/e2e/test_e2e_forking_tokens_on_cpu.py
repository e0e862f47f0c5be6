# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Forking tokens in verl 0.7.1's own GRPO trainer on CPU (``E2E_PG_TOKEN_QUANTILE`` of ``test_entropy_e2e.sh``).

The tiny e2e run with ``actor_rollout_ref.rollout.custom.entropy.pg_token_quantile=0.2``: the policy gradient only at
the top 20 % of the batch's response tokens by rollout entropy, no extra forward pass. The script checks every step
(``check_metrics --pg-token-quantile 0.2``: kept share in [0.2, 0.25], threshold logged, kept tokens more uncertain
than dropped ones); the test re-reads the kept share, the threshold, the loss and the update of every step.
"""

from __future__ import annotations

import math

import pytest
import torch

from treetune_tests.e2e.check_metrics import GRAD_NORM, KEPT_SHARE, PG_LOSS, THRESHOLD, read_steps, training_steps
from treetune_tests.e2e.script import REPO_ROOT, run_script

WORKDIR = REPO_ROOT / "outputs" / "e2e-test-forking-tokens"
QUANTILE = 0.2


def test_forking_token_arguments(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    args = run_script({**env, "E2E_PG_TOKEN_QUANTILE": "0.2"}, timeout=300).stdout.splitlines()
    assert "actor_rollout_ref.rollout.custom.entropy.pg_token_quantile=0.2" in args
    refused = run_script({**env, "E2E_PG_TOKEN_QUANTILE": "0.2", "E2E_BLOCK": "0"}, timeout=60)
    assert refused.returncode == 2 and "needs the override block" in refused.stderr


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_grpo_on_forking_tokens_trains_every_step():
    env = {"E2E_MODEL": "tiny", "E2E_PG_TOKEN_QUANTILE": str(QUANTILE), "E2E_STEPS": "2", "E2E_WORKDIR": str(WORKDIR)}
    result = run_script(env, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    steps = training_steps(read_steps(WORKDIR / "metrics.jsonl"))
    assert [m["step"] for m in steps] == [1, 2]
    for metrics in steps:
        assert QUANTILE <= metrics[KEPT_SHARE] <= QUANTILE + 0.05
        assert metrics[THRESHOLD] > 0
        assert math.isfinite(metrics[PG_LOSS]) and metrics[GRAD_NORM] > 0
    print(result.stdout[-2000:])
