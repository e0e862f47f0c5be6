# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Forking tokens in verl's own GRPO trainer on CPU (``E2E_PG_TOKEN_QUANTILE`` of ``test_entropy_e2e.sh``): the
script's arguments.

``E2E_PG_TOKEN_QUANTILE=0.2`` writes ``actor_rollout_ref.rollout.custom.entropy.pg_token_quantile=0.2``: the policy
gradient only at the top 20 % of the batch's response tokens by rollout entropy, no extra forward pass; the script
checks every step (``check_metrics --pg-token-quantile 0.2``: kept share in [0.2, 0.25], threshold logged, kept tokens
more uncertain than dropped ones). The GRPO run that trains with it is the full / resume pair of
``test_e2e_variants_on_cpu.py`` on both stacks, with the other features on.
"""

from __future__ import annotations

from treetune_tests.e2e.script import run_script


def test_forking_token_arguments(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    args = run_script({**env, "E2E_PG_TOKEN_QUANTILE": "0.2"}, timeout=300).stdout.splitlines()
    assert "actor_rollout_ref.rollout.custom.entropy.pg_token_quantile=0.2" in args
    refused = run_script({**env, "E2E_PG_TOKEN_QUANTILE": "0.2", "E2E_BLOCK": "0"}, timeout=60)
    assert refused.returncode == 2 and "needs the override block" in refused.stderr
    stock = run_script({**env, "E2E_FORECAST": "1", "E2E_BLOCK": "0"}, timeout=300).stdout.splitlines()
    assert "hydra.searchpath=[pkg://treetune_verl.config]" in stock and "+treetune=rollout_entropy" not in stock
