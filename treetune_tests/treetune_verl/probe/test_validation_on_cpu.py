# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Each value check has one home and names the config key, whichever entry point reaches it first."""

from __future__ import annotations

import pytest
import torch

from treetune_tests.treetune_verl.probe.tiny import PAD, PROMPTS, sample_batch, tiny_llama
from treetune_verl.probe.advantages import group_advantages
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.sampling import sample_responses


@pytest.mark.parametrize(
    ("temperature", "top_p", "message"),
    [
        (0.0, 1.0, "generation.temperature must be > 0, got 0.0"),
        (1.0, 1.5, "generation.top_p must be in (0, 1], got 1.5"),
    ],
)
def test_policy_values_get_the_same_error_from_the_config_and_the_sampler(temperature, top_p, message):
    with pytest.raises(ValueError) as from_config:
        resolve_config({"generation": {"temperature": temperature, "top_p": top_p}})
    with pytest.raises(ValueError) as from_sampler:
        sample_responses(tiny_llama(), PROMPTS, 2, temperature, top_p, 3, PAD)
    assert str(from_config.value) == str(from_sampler.value) == message


def test_group_size_errors_name_the_setting_and_batch_G():
    with pytest.raises(ValueError) as advantages:
        group_advantages(torch.ones(2, 1), "dr_grpo")
    assert str(advantages.value) == (
        "advantage.estimator=dr_grpo uses the group mean as baseline over the G responses of a prompt: "
        "needs batch.G >= 2, got G=1"
    )
    model = tiny_llama()
    E = sample_batch(model, PROMPTS, 1, 3, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError) as naive:
        ProbeComponents(model, {"estimator": {"x_estimator_mode": "naive"}}).accumulate_sum_X(E, 2)
    assert str(naive.value) == (
        "estimator.x_estimator_mode=naive uses a leave-one-out baseline over the G responses of a prompt: "
        "needs batch.G >= 2, got G=1"
    )
    assert all(p.grad is None for p in model.parameters())  # the failed pass left no gradient behind
