# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's per-micro-batch rollout-correction metrics on a micro-batch of aborted rows, with and without the guard."""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo import rollout_corr_helper

from treetune_verl.patching import original_of
from treetune_verl.verl.v0_7_1 import actor_seams
from treetune_verl.verl_guard import UnsupportedVerlError


@pytest.fixture
def restored():
    original = original_of(rollout_corr_helper.compute_rollout_corr_metrics_from_logprobs)
    yield original
    rollout_corr_helper.compute_rollout_corr_metrics_from_logprobs = original


def test_empty_micro_batch_gives_no_metrics_instead_of_an_assertion(restored):
    log_prob, rollout_log_prob = torch.randn(2, 5), torch.randn(2, 5)
    empty, some = torch.zeros(2, 5), torch.tensor([[1.0, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    with pytest.raises(AssertionError, match="at least one valid token"):  # verl as shipped
        restored(log_prob, rollout_log_prob, empty)
    wrapped = actor_seams._wrap_rollout_corr_metrics(restored)  # the seam's wrapper (install: test_loss_aggregation)
    guarded = wrapped
    assert guarded(log_prob, rollout_log_prob, empty) == {}
    assert guarded(log_prob, rollout_log_prob, some) == restored(log_prob, rollout_log_prob, some) != {}


def test_refuses_a_changed_signature(restored, monkeypatch):
    monkeypatch.setattr(rollout_corr_helper, "compute_rollout_corr_metrics_from_logprobs", lambda log_prob, mask: {})
    with pytest.raises(UnsupportedVerlError, match="compute_rollout_corr_metrics_from_logprobs"):
        actor_seams.install()
