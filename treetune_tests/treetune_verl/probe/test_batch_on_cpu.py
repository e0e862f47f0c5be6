# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Batch layout, policy conventions, advantages and the residual baseline's update rule."""

from __future__ import annotations

import pytest
import torch

from treetune_verl.probe.advantages import group_advantages
from treetune_verl.probe.arithmetic import arithmetic_reward
from treetune_verl.probe.batch import iter_microbatches, make_probe_batch, validate_probe_batch
from treetune_verl.probe.estimators import ResidualBaseline
from treetune_verl.probe.policy import entropy_from_log_probs, policy_log_probs


def test_make_probe_batch_matches_the_documented_worked_example():
    batch = make_probe_batch([[5, 6, 7], [8]], [[[1, 2], [3]], [[4, 4, 4], [9]]], [[0.5, -0.5], [1.0, -1.0]], 0)
    assert batch["sequences"].shape == (2, 2, 6)
    assert torch.equal(batch["sequences"][0], torch.tensor([[5, 6, 7, 1, 2, 0], [5, 6, 7, 3, 0, 0]]))
    assert torch.equal(batch["sequences"][1], torch.tensor([[0, 0, 8, 4, 4, 4], [0, 0, 8, 9, 0, 0]]))
    assert torch.equal(batch["attention_masks"][0], torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]))
    assert torch.equal(batch["attention_masks"][1], torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]]))
    assert torch.equal(batch["prompt_lens"], torch.tensor([3, 1]))
    assert torch.equal(batch["max_lengths"], torch.tensor([2, 3]))
    assert batch["advantages"].dtype == torch.float32
    assert validate_probe_batch(batch) == (2, 2, 3)
    explicit = make_probe_batch([[5, 6, 7], [8]], [[[1, 2], [3]], [[4, 4, 4], [9]]], torch.zeros(2, 2), 0, [8, 8])
    assert torch.equal(explicit["max_lengths"], torch.tensor([8, 8]))


def test_microbatches_slice_the_prompt_dimension_and_keep_the_width():
    batch = make_probe_batch([[1], [2, 3], [4]], [[[1], [2]]] * 3, torch.zeros(3, 2), 0)
    parts = list(iter_microbatches(batch, 2))
    assert [p["sequences"].shape[0] for p in parts] == [2, 1]
    assert all(p["sequences"].shape[-1] == batch["sequences"].shape[-1] for p in parts)
    assert torch.equal(torch.cat([p["advantages"] for p in parts]), batch["advantages"])


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    for top_p, kept in [(0.45, 1), (0.55, 2), (0.75, 2), (0.85, 3), (0.97, 4), (1.0, 4)]:
        log_probs, _ = policy_log_probs(logits, 1.0, top_p)
        support = torch.isfinite(log_probs)
        assert int(support.sum()) == kept, top_p
        torch.testing.assert_close(log_probs[support].exp(), probs[:kept] / probs[:kept].sum())


def test_entropy_under_top_p_has_finite_gradients():
    logits = torch.tensor([[2.0, 1.0, -1.0, -3.0]], requires_grad=True)
    log_probs, keep = policy_log_probs(logits, 0.5, 0.9)
    H = entropy_from_log_probs(log_probs, keep)
    H.sum().backward()
    assert torch.isfinite(H).all() and torch.isfinite(logits.grad).all()
    assert logits.grad[0, ~keep[0]].abs().sum() == 0  # masked tokens get no gradient


def test_group_advantages():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.3, 0.3, 0.3, 0.3]])
    grpo = group_advantages(rewards, "grpo")
    dr = group_advantages(rewards, "dr_grpo")
    torch.testing.assert_close(dr[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    torch.testing.assert_close(grpo[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (rewards[0].std() + 1e-6))
    # Equal rewards: exactly zero, not NaN (std = 0) and not a last-bit residue of the mean.
    assert torch.equal(grpo[1], torch.zeros(4)) and torch.equal(dr[1], torch.zeros(4))


def test_arithmetic_reward_reads_the_first_integer():
    assert arithmetic_reward(" 12<|im_end|>", 12) == 1.0
    assert arithmetic_reward(" 12, and 3 + 4 = 7", 12) == 1.0
    assert arithmetic_reward(" 1 + 11 = 12", 12) == 0.0
    assert arithmetic_reward(" twelve", 12) == 0.0


def test_residual_baseline_running_mean_convention():
    baseline = ResidualBaseline(ema_decay=0.9)
    assert torch.equal(baseline.vector(3), torch.zeros(3))  # never seen: μ = 0
    # First batch initialises seen positions to the batch mean (no shrinkage towards 0).
    baseline.update(
        torch.tensor([4.0, 2.0, 0.0], dtype=torch.float64), torch.tensor([2.0, 2.0, 0.0], dtype=torch.float64)
    )
    torch.testing.assert_close(baseline.vector(3), torch.tensor([2.0, 1.0, 0.0]))
    # Later: μ ← decay·μ + (1 - decay)·m; position 2 now seen for the first time.
    baseline.update(
        torch.tensor([12.0, 0.0, 3.0], dtype=torch.float64), torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64)
    )
    torch.testing.assert_close(baseline.vector(3), torch.tensor([0.9 * 2 + 0.1 * 6, 0.9 * 1 + 0.1 * 0, 3.0]))
    with pytest.raises(ValueError, match="ema_decay"):
        ResidualBaseline(ema_decay=1.0)
