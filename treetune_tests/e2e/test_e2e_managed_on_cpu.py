# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy_managed_agent`` in verl 0.7.1's own GRPO trainer on CPU (the tiny e2e run of ``test_entropy_e2e.sh``).

Selected by overrides only (no switch in the script): the managed loop as the default loop through
``treetune_verl/config/managed_agent_loops.yaml``, the agent ``agents.two_turn_agent`` (answer, a masked follow-up
user turn, answer again) by ``custom.managed.agent_fn``. The script checks every step (finite loss, grad norm > 0,
rollout entropy mean > 0, rollout/actor probability agreement: the engine served the tokens the actor scores); the
test re-reads them and that every rollout had the agent's 4 messages.
"""

from __future__ import annotations

import math

import pytest
import torch

from treetune_tests.e2e.check_metrics import ENTROPY_MEAN, GRAD_NORM, PEARSON, PG_LOSS, read_steps, training_steps
from treetune_tests.e2e.script import REPO_ROOT, run_script
from treetune_verl.config import CONFIG_DIR

WORKDIR = REPO_ROOT / "outputs" / "e2e-test-managed"
MANAGED_ARGS = (
    "actor_rollout_ref.rollout.agent.default_agent_loop=entropy_managed_agent",
    f"actor_rollout_ref.rollout.agent.agent_loop_config_path={CONFIG_DIR / 'managed_agent_loops.yaml'}",
    "+actor_rollout_ref.rollout.custom.managed.agent_fn=treetune_tests.treetune_verl.managed.agents:two_turn_agent",
)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_grpo_with_managed_agent_trains_every_step():
    env = {"E2E_MODEL": "tiny", "E2E_STEPS": "2", "E2E_WORKDIR": str(WORKDIR)}
    result = run_script(env, *MANAGED_ARGS, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    steps = training_steps(read_steps(WORKDIR / "metrics.jsonl"))
    assert [m["step"] for m in steps] == [1, 2]
    for metrics in steps:
        assert math.isfinite(metrics[PG_LOSS]) and metrics[GRAD_NORM] > 0
        assert metrics[ENTROPY_MEAN] > 0 and metrics[PEARSON] > 0.999
        assert metrics["num_turns/min"] == metrics["num_turns/max"] == 4  # user, model, user (masked), model
    print(result.stdout[-2000:])
