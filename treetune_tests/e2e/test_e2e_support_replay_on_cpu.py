# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Issue 48 end to end, both stacks: 2 GRPO steps of verl's own ``main_ppo`` on the tiny model at top-p 0.8 in entropy
mode ``support`` (replay on): the actor's probabilities of the batch's tokens equal the rollout's renormalised ones
(verl's own probability difference, our importance ratio and entropy agreement). Without replay the ratio is each
token's kept mass (0.83 on these settings: the README's pairs), so a replay that does not take fails here. On verl
0.7.1 the replay seams come with our actor entry point (``external_lib``), which the run names as a user must."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from treetune_tests.e2e.script import kept_workdir, run_training

PINNED_ACTOR_SETUP = "actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup"


@pytest.mark.slow
@pytest.mark.e2e
def test_support_replay_in_grpo_scores_the_sampled_distribution():
    workdir = kept_workdir("support-replay")
    env = {"E2E_MODEL": "tiny", "E2E_STEPS": "2", "E2E_WORKDIR": str(workdir)}
    args = ["actor_rollout_ref.rollout.custom.entropy.mode=support", "actor_rollout_ref.rollout.top_p=0.8"]
    if importlib.metadata.version("verl") == "0.7.1":  # on verl 0.9.1 the script names it already
        args.append(PINNED_ACTOR_SETUP)
    run_training(env, *args, timeout=1200)
    steps = [json.loads(line)["data"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steps = [data for data in steps if "actor/pg_loss" in data]
    assert len(steps) == 2
    for data in steps:
        assert data["rollout_support/importance_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert data["rollout_support/importance_ratio_outside_0.9_1.1"] == 0.0
        assert data["training/rollout_probs_diff_mean"] <= 1e-5
        assert data["rollout_entropy/actor_abs_diff/mean"] <= 1e-5
        assert 1.0 <= data["rollout_support/size_mean"] < 100 and 0.5 < data["rollout_support/kept_mass_mean"] < 1.0
