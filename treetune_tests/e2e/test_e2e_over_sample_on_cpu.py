# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling with abort in verl's own GRPO trainer on CPU (``E2E_OVER_SAMPLE`` of ``test_entropy_e2e.sh``): the
script's arguments, and the GRPO run with carry-over (``E2E_CARRY_OVER=1``), both stacks. The GRPO run of plain
over-sampling is the run with every feature on: the full / resume runs of ``test_e2e_variants_on_cpu.py`` (both
stacks), which make the checks below.

The tiny e2e run (4 prompts x n = 2 = 8 rows per step) with ``actor_rollout_ref.rollout.over_sample_rate=0.25``,
``algorithm.adv_estimator=grpo_valid`` and ``actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup``,
and one row per actor micro-batch (``ppo_micro_batch_size_per_gpu=1``), so that every aborted row is a micro-batch
of its own: without the actor's loss fix each of them is 0/0 in verl's ``agg_loss`` (NaN gradients; the unit-level
negative control is ``treetune_tests/treetune_verl/ppo/test_loss_aggregation_on_cpu.py``). The script checks every
step (``check_metrics --aborted-ratio 0.25``); those runs' tests re-read the metrics: exactly 2 of 8 rows aborted at every
step, in our metric and in verl's own ``response/aborted_ratio``; finite loss and a non-zero update at every step, so
each step after an aborted one generated and trained normally.

On verl 0.9.1 the same run goes through V1's replay buffer (``verl/v0_9_1/over_sample_sampler.py``): 1 of 4 groups
is aborted at every step and never reaches verl's batch (verl's ``response/aborted_ratio`` is 0; the 6 kept rows are
padded to 8 by verl itself), and the step trains.
"""

from __future__ import annotations

import importlib.metadata
import math

import pytest
import torch

from treetune_tests.e2e.check_metrics import GRAD_NORM, PG_LOSS, read_steps, training_steps
from treetune_tests.e2e.script import kept_workdir, run_script

CURRENT = importlib.metadata.version("verl") == "0.9.1"
SAMPLER_KEYS = {
    "trainer.v1.sampler.custom_sampler.path=pkg://treetune_verl.verl.v0_9_1.over_sample_sampler",
    "trainer.v1.sampler.custom_sampler.name=OverSampleReplayBuffer",
}


def test_over_sample_arguments(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    plain = run_script(env, timeout=300).stdout.splitlines()
    over = run_script({**env, "E2E_OVER_SAMPLE": "0.25"}, timeout=300).stdout.splitlines()
    assert "algorithm.adv_estimator=grpo" in plain
    only_over = ("actor_rollout_ref.rollout.over_sample_rate",)  # on verl 0.9.1 the block itself names external_lib
    only_over += () if CURRENT else ("actor_rollout_ref.model.external_lib",)
    assert not any(a.startswith(only_over) for a in plain)
    assert {
        "algorithm.adv_estimator=grpo_valid",
        "actor_rollout_ref.rollout.over_sample_rate=0.25",
        "actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup",
    } <= set(over)
    assert (set(over) >= SAMPLER_KEYS) == CURRENT and not SAMPLER_KEYS & set(plain)  # verl 0.9.1's replay buffer
    refused = run_script({**env, "E2E_OVER_SAMPLE": "0.25", "E2E_BLOCK": "0"}, timeout=60)
    assert refused.returncode == 2 and "needs the override block" in refused.stderr
    carry = run_script({**env, "E2E_OVER_SAMPLE": "0.25", "E2E_CARRY_OVER": "1"}, timeout=300).stdout.splitlines()
    assert {
        "+actor_rollout_ref.rollout.custom.over_sample.carry_over=true",
        "algorithm.rollout_correction.rollout_is=token",
    } <= set(carry) - set(over)
    refused = run_script({**env, "E2E_CARRY_OVER": "1"}, timeout=60)
    assert refused.returncode == 2 and "needs over-sampling" in refused.stderr


CARRY_WORKDIR = kept_workdir("carry-over")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_grpo_with_carry_over_resumes_and_trains_the_aborted_groups():
    """``E2E_CARRY_OVER=1``: 4 steps; each aborts 1 of 4 groups, which the next resumes (``check_metrics
    --carry-over``), with verl's token-level rollout correction; the entropy agreement (fresh tokens) keeps its bound.

    On verl 0.9.1 the group not kept stays running through the pause around the weight update and is kept once it
    finishes (``check_metrics`` checks the shares); tokens of earlier weights are trained."""
    env = {"E2E_MODEL": "tiny", "E2E_OVER_SAMPLE": "0.25", "E2E_CARRY_OVER": "1", "E2E_STEPS": "4"}
    extra = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",) if CURRENT else ()
    result = run_script({**env, "E2E_WORKDIR": str(CARRY_WORKDIR)}, *extra, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    steps = training_steps(read_steps(CARRY_WORKDIR / "metrics.jsonl"))
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    carried = "rollout/carry_over/"
    assert steps[0][carried + "groups_resumed"] == 0
    if CURRENT:
        assert all(m[carried + "groups_carried"] + m["rollout/aborted_groups"] == 1 for m in steps), steps
        assert sum(m[carried + "tokens_trained"] for m in steps) > 0
        assert all(m[carried + "discarded_share"] < 0.05 for m in steps), steps
        assert all(math.isfinite(m[PG_LOSS]) and m[GRAD_NORM] > 0 for m in steps)
        print(result.stdout[-2000:])
        return
    for before, metrics in zip(steps, steps[1:], strict=False):
        assert metrics[carried + "groups_resumed"] == before[carried + "groups_carried"] >= 1
    assert sum(m[carried + "rows_trained"] for m in steps) > 0
    for metrics in steps:  # the group not kept is carried, not aborted (as on verl 0.9.1); verl's batch holds it empty
        assert metrics["response/aborted_ratio"] == 0.25 and metrics["rollout/aborted_groups"] == 0
        assert metrics[carried + "discarded_share"] < 0.05
        assert math.isfinite(metrics[PG_LOSS]) and metrics[GRAD_NORM] > 0
    print(result.stdout[-2000:])
