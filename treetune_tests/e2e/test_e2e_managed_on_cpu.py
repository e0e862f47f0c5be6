# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy_managed_agent`` in verl's own GRPO trainer on CPU (the tiny e2e run of ``test_entropy_e2e.sh``), on both
stacks (verl 0.9.1: its V1 trainer; the k rows of a session through ``verl/v0_9_1/session_rows_worker.py``).

Selected by overrides only (no switch in the script): the managed loop as the default loop through
``treetune_verl/config/managed_agent_loops.yaml``, and either

- the README's example environment (``treetune_verl/examples/calculator.py``) by ``custom.managed.environment``:
  3 steps trained on its own rewards, or
- the agent ``agents.branching_agent`` (answer, a masked follow-up user turn, two answers to it, each scored by the
  agent) by ``custom.managed.agent_fn``, with ``rows_per_session=2``: each prompt's ``rollout.n=2`` rows are one
  session's two branches.

The script checks every step (finite loss, grad norm > 0, rollout entropy mean > 0, rollout/actor agreement of
probabilities and of entropy, the latter ≤ 1e-3 nats on CPU); the tests re-read them, and that verl trained on the
agent's rewards: verl's ``critic/score/mean`` (the rewards the advantages were computed from) is the agents' mean.
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
    read_steps,
    training_steps,
)
from treetune_tests.e2e.script import kept_workdir, run_script
from treetune_verl.config import CONFIG_DIR

MANAGED_LOOP_ARGS = (
    "actor_rollout_ref.rollout.agent.default_agent_loop=entropy_managed_agent",
    f"actor_rollout_ref.rollout.agent.agent_loop_config_path={CONFIG_DIR / 'managed_agent_loops.yaml'}",
)
CALCULATOR_ARGS = (
    *MANAGED_LOOP_ARGS,
    "+actor_rollout_ref.rollout.custom.managed.environment=treetune_verl.examples.calculator:Calculator",
)
BRANCHING_ARGS = (
    *MANAGED_LOOP_ARGS,
    "+actor_rollout_ref.rollout.custom.managed.agent_fn=treetune_tests.treetune_verl.managed.agents:branching_agent",
    "+actor_rollout_ref.rollout.custom.managed.rows_per_session=2",
)
AGENT_REWARD = "managed/agent_reward/mean"


def _run(name: str, steps: int, args: tuple[str, ...]) -> list[dict]:
    workdir = kept_workdir(name)
    env = {"E2E_MODEL": "tiny", "E2E_STEPS": str(steps), "E2E_WORKDIR": str(workdir)}
    result = run_script(env, *args, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    print(result.stdout[-2000:])
    metrics = training_steps(read_steps(workdir / "metrics.jsonl"))
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    for step in metrics:
        assert math.isfinite(step[PG_LOSS]) and step[GRAD_NORM] > 0
        assert step[ENTROPY_MEAN] > 0 and step[PEARSON] > 0.999 and step[ENTROPY_DIFF] <= 1e-3
        assert step["managed/agent_scored_ratio"] == 1.0
        assert step["critic/score/mean"] == pytest.approx(step[AGENT_REWARD], abs=1e-6)  # trained on the agent's
    return metrics


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_grpo_trains_the_example_environment_on_its_rewards():
    for step in _run("calculator", 3, CALCULATOR_ARGS):
        assert step["managed/rows_per_session/mean"] == 1 and step["managed/turns_per_row/mean"] >= 1
        print(
            f"step {step['step']}: agent reward {step[AGENT_REWARD]:.3f}, turns/row "
            f"{step['managed/turns_per_row/mean']:.2f}, tool calls/row {step['managed/tool_calls_per_row/mean']:.2f}, "
            f"|rollout - actor entropy| {step[ENTROPY_DIFF]:.2e} nats"
        )


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_grpo_trains_two_branches_of_one_session_as_a_group():
    for step in _run("managed-branches", 2, BRANCHING_ARGS):
        assert step["managed/rows_per_session/mean"] == step["managed/branches_per_session/mean"] == 2
        assert step["num_turns/min"] == step["num_turns/max"] == 4  # user, model, user (masked), model
