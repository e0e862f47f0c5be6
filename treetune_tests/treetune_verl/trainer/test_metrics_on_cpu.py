# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``rollout_entropy_metrics`` against hand-computed values (pooled over ``response_mask`` tokens)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from treetune_verl.agent_loop import rollout_entropy_metrics
from treetune_verl.trainer.metrics import agreement_is_defined


def test_metrics_over_response_mask():
    entropy = torch.tensor([[1.0, 2.0, 9.0, 0.0], [3.0, 4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]])
    metrics = rollout_entropy_metrics(entropy, mask)
    assert metrics == {
        "agent_loop/rollout_entropy/mean": 2.5,
        "agent_loop/rollout_entropy/p50": 2.5,
        "agent_loop/rollout_entropy/p90": pytest.approx(3.7),
        "agent_loop/rollout_entropy/max": 4.0,
    }
    assert rollout_entropy_metrics(entropy, torch.zeros_like(mask)) == {}


def test_rows_without_entropy_are_left_out_and_counted():
    """A stock loop's all-zero row is not a measured entropy: it must not pull the mean down."""
    entropy = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    has_entropy = torch.tensor([True, False, True])
    metrics = rollout_entropy_metrics(entropy, mask, has_entropy)
    assert metrics["agent_loop/rollout_entropy/mean"] == 2.0  # (1 + 2 + 3) / 3, not 6 / 6
    assert metrics["agent_loop/rollout_entropy/max"] == 3.0
    assert metrics["agent_loop/rollout_entropy/rows_without_entropy"] == 1.0
    none_carry = rollout_entropy_metrics(entropy, mask, torch.zeros(3, dtype=torch.bool))
    assert none_carry == {"agent_loop/rollout_entropy/rows_without_entropy": 3.0}


def test_managed_session_metrics_count_each_session_once():
    """Two sessions: one of 2 rows (3 branches, agent-scored 1.0 and 0.0), one of 1 row (unscored); a stock row."""
    from treetune_verl.trainer.metrics import managed_session_metrics

    def row(rows, branches, turns, tool_calls, score):
        return {"rows": rows, "branches": branches, "turns": turns, "tool_calls": tool_calls, "agent_score": score}

    rows = [row(2, 3, 2, 1, 1.0), row(2, 3, 3, 0, 0.0), row(1, 1, 1, 2, None), None]
    assert managed_session_metrics(rows) == {
        "managed/rows_per_session/mean": 1.5,  # (2 + 1) rows / 2 sessions
        "managed/branches_per_session/mean": 2.0,  # (3 + 1) / 2
        "managed/turns_per_row/mean": 2.0,
        "managed/tool_calls_per_row/mean": 1.0,
        "managed/agent_scored_ratio": pytest.approx(2 / 3),
        "managed/agent_reward/mean": 0.5,
    }
    assert managed_session_metrics([None, None]) == {}


@pytest.mark.parametrize(
    ("entropy", "temperature", "defined"),
    [
        ({"top_k": 0, "mode": "raw"}, 1.0, True),
        ({"top_k": 0, "mode": "raw"}, 0.7, False),  # raw entropy is of softmax(z), the actor's of softmax(z / T)
        ({"top_k": 0, "mode": "tempered"}, 0.7, True),
        ({"top_k": 20, "mode": "tempered"}, 1.0, False),  # the actor's entropy is over the full vocabulary
    ],
)
def test_agreement_is_defined_only_for_the_actors_distribution(entropy, temperature, defined):
    rollout = OmegaConf.create({"temperature": temperature, "custom": {"entropy": entropy}})
    assert agreement_is_defined(rollout) is defined
