# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every feature at once on one command line: the e2e script's switches write the overrides each feature's README
section names, and they compose (the over-sampling and forecast blocks name the same actor entry point,
``treetune_verl.verl.process_setup``; the README block once, last).

The GRPO run of every feature at once is the variants' full / resume pair (``test_e2e_variants_on_cpu.py``), on both
stacks: over-sampling with abort (``over_sample_rate=0.25``), forking tokens (``pg_token_quantile=0.2``) and the live
forecast every step, at 2 ranks with validation, checkpoint and resume; on verl 0.7.1 one row per actor micro-batch,
so that each aborted row (an empty response in verl 0.7.1's batch) is a micro-batch of its own. Every check this
file's own 3-step GRPO run made (finite loss, grad norm > 0, rollout entropy and its agreement with the actor, the
exact aborted share in our metric and verl's, the aborted-as-zero score below the completed one, the forking-token
share and threshold, every forecast key finite, one optimizer step forecast, E sampled by the servers, the plot) is
made there at each of its two steps; the run here was its duplicate at ~130 s of CI (2026-11-29).
"""

from __future__ import annotations

from treetune_tests.e2e.script import run_script

SWITCHES = {"E2E_OVER_SAMPLE": "0.25", "E2E_PG_TOKEN_QUANTILE": "0.2", "E2E_FORECAST": "1"}


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
