# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The rollout-entropy block in a stock ``python -m verl.trainer.main_ppo`` of verl 0.9.1 (its default V1 trainer on
TransferQueue, Ray, an FSDP2 engine-worker actor, our server over verl's sglang 0.5.12 server): 2 GRPO steps on CPU
with the tiny random Qwen2.

Runs ``test_entropy_e2e.sh`` (``make e2e STACK=current``), which checks every step's metrics itself (rollout entropy,
the agreement with the actor's entropy of the same tokens <= 1e-3 nats, verl's rollout-vs-actor probabilities, our
seconds per feature), and re-reads its ``metrics.jsonl``; with validation before training and at every step (its
rollout entropy: ``val-aux/rollout_entropy/...``) and forking tokens (``pg_token_quantile=0.2``: the kept share, the
kept tokens' entropy above the dropped ones'). About 2 minutes on 2 cores. Output:
``outputs/e2e-current-tiny/``.
"""

from __future__ import annotations

import importlib.metadata
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
from treetune_tests.e2e.script import REPO_ROOT, run_script, run_training

WORKDIR = REPO_ROOT / "outputs" / "e2e-current-tiny"
ACTOR_SETUP = "actor_rollout_ref.model.external_lib=treetune_verl.trainer.actor_setup"

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")


def test_the_block_names_the_actor_entry_point_on_verl_0_9_1(tmp_path):
    """verl 0.9.1 builds the servers before it loads the block's manager: the entry point selects the server."""
    env = {"E2E_MODEL": "tiny", "E2E_PRINT_ARGS": "1", "E2E_WORKDIR": str(tmp_path)}
    block = run_script(env, timeout=300)
    assert block.returncode == 0, block.stderr
    assert ACTOR_SETUP in block.stdout.splitlines() and "+treetune=rollout_entropy" in block.stdout.splitlines()
    stock = run_script({**env, "E2E_BLOCK": "0"}, timeout=300)
    assert stock.returncode == 0 and ACTOR_SETUP not in stock.stdout.splitlines()


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_rollout_entropy_block_in_verl_0_9_1_grpo_two_steps_on_cpu():
    # forking tokens too (the top 20 % of tokens by rollout entropy carry the policy gradient): trainer-side steering
    env = {"E2E_MODEL": "tiny", "E2E_STEPS": "2", "E2E_WORKDIR": str(WORKDIR), "E2E_PG_TOKEN_QUANTILE": "0.2"}
    validation = ("trainer.val_before_train=True", "trainer.test_freq=1")  # the full variant's, without its ref model
    result = run_training(env, *validation, timeout=1200)  # exit 0, nothing of the trainer's session left
    assert "OK: 2 step(s)" in result.stdout

    steps = read_steps(WORKDIR / "metrics.jsonl")
    assert [s["step"] for s in steps] == [0, 1, 2]  # validation before training, then 2 trained steps
    bounds = {"max_probs_diff": 1e-3, "min_pearson": 0.999, "max_entropy_diff": 1e-3}
    assert check(steps, min_steps=2, val=True, pg_token_quantile=0.2, **bounds) == []
    steps = steps[1:]
    for metrics in steps:
        assert math.isfinite(metrics[PG_LOSS]) and metrics[GRAD_NORM] > 0
        # sglang serves the weights the actor computes with: after step 1's update too (the weight sync works)
        assert metrics[PROBS_DIFF] <= 1e-3 and metrics[PEARSON] >= 0.999
        # every row came from the entropy loop, and its entropy is the actor's of the same tokens
        assert metrics[ENTROPY_MEAN] > 0 and metrics["timing_s/agent_loop/rollout_entropy/rows_without_entropy"] == 0
        assert metrics[ENTROPY_DIFF] <= 1e-3 and metrics["rollout_entropy/actor_abs_diff/max"] <= 1e-2
