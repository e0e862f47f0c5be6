# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every feature at once in verl 0.7.1's own GRPO trainer on CPU: they compose on one command line.

The tiny e2e run (4 prompts x n = 2 = 8 rows per step) with the README block (rollout entropy), over-sampling with
abort (``over_sample_rate=0.25``, ``grpo_valid``), forking tokens (``pg_token_quantile=0.2``) and the live entropy
forecast every step (``+treetune_forecast=entropy_forecast``), all selected by the e2e script's switches, which write
the overrides each feature's README section names: the over-sampling and forecast blocks name the same actor entry
point (``treetune_verl.verl.process_setup``). One row per actor micro-batch, so that each aborted row is a
micro-batch of its own (the loss fix's hardest case) while the forecast runs at the update's first optimizer step
inside the loss fix's step counter. The script checks every step (``check_metrics``: finite loss, grad norm > 0,
rollout entropy, the rollout-vs-actor entropy agreement <= 1e-3 nats and verl's probability agreement, the exact
aborted share, the forking-token share, every forecast key); the test re-reads them. On verl 0.7.1 this is the GRPO run
of over-sampling with abort, forking tokens and the forecast (their own files check the script's arguments): each
feature's checks of a run of its own are here, with the others on.
"""

from __future__ import annotations

import math

import pytest
import torch

from treetune_tests.e2e.check_metrics import (
    ENTROPY_DIFF,
    ENTROPY_MEAN,
    FORECAST_KEYS,
    GRAD_NORM,
    KEPT_SHARE,
    PG_LOSS,
    THRESHOLD,
    read_steps,
    training_steps,
)
from treetune_tests.e2e.script import kept_workdir, run_script

WORKDIR = kept_workdir("all-features")
SWITCHES = {"E2E_OVER_SAMPLE": "0.25", "E2E_PG_TOKEN_QUANTILE": "0.2", "E2E_FORECAST": "1"}
STEPS = 3


def test_all_features_arguments(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    args = run_script({**env, **SWITCHES}, timeout=300).stdout.splitlines()
    libs = [a for a in args if a.startswith("actor_rollout_ref.model.external_lib=")]
    assert set(libs) == {"actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup"}
    assert {
        "+treetune=rollout_entropy",
        "+treetune_forecast=entropy_forecast",
        "algorithm.adv_estimator=grpo_valid",
        "actor_rollout_ref.rollout.over_sample_rate=0.25",
        "actor_rollout_ref.rollout.custom.entropy.pg_token_quantile=0.2",
    } <= set(args)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_grpo_with_every_feature_on_trains_every_step():
    env = {"E2E_MODEL": "tiny", "E2E_STEPS": str(STEPS), "E2E_WORKDIR": str(WORKDIR), **SWITCHES}
    result = run_script(env, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    steps = training_steps(read_steps(WORKDIR / "metrics.jsonl"))
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    for metrics in steps:
        assert math.isfinite(metrics[PG_LOSS]) and metrics[GRAD_NORM] > 0
        assert metrics[ENTROPY_MEAN] > 0 and metrics[ENTROPY_DIFF] <= 1e-3  # rollout entropy, aligned with the actor
        # over-sampling: exactly 2 of 8 rows aborted, in our metric and in verl's own count of empty responses
        assert metrics["rollout/aborted_ratio"] == 0.25 and metrics["response/aborted_ratio"] == 0.25
        assert metrics["rollout/aborted_rows"] == 2
        assert metrics["rollout/score/aborted_as_zero_mean"] <= metrics["rollout/score/completed_mean"]
        # forking tokens (ties may keep a little more)
        assert 0.2 <= metrics[KEPT_SHARE] <= 0.25 and metrics[THRESHOLD] > 0
        # the forecast saw the update's one optimizer step, so the update's realised change is the first step's
        assert all(math.isfinite(metrics[key]) for key in FORECAST_KEYS)
        assert metrics["probe/optimizer_steps"] == 1
        assert metrics["probe/deltaH_realised_first_step"] == metrics["probe/deltaH_realised"]
        assert metrics["timing_s/probe"] > 0 and metrics["probe/step_norm"] > 0
        # E sampled by the rollout's sglang server beside the step's rollout, none in the actor; half of the four
        # prompts (eval_share 0.5)
        assert metrics["probe/sample_s"] == 0 and metrics["probe/eval_prompts"] == 2
        assert metrics["probe/eval_gen_s"] > 0 and 0 < metrics["probe/eval_gen_token_share"] < 1
    assert (WORKDIR / "entropy_forecast.png").read_bytes()[:4] == b"\x89PNG"
    print(result.stdout[-2000:])
