# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``rollout_entropy_metrics`` against hand-computed values (pooled over ``response_mask`` tokens)."""

from __future__ import annotations

import pytest
import torch

from treetune_verl.agent_loop import rollout_entropy_metrics


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
