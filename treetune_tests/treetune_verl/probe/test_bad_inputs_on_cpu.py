# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Bad input gets a clear error; all-zero advantages give ΔH₁ = 0 exactly."""

from __future__ import annotations

import math

import pytest
import torch

from treetune_tests.treetune_verl.probe.tiny import PAD, PROMPTS, sample_batch, tiny_llama
from treetune_verl.probe.advantages import group_advantages
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.mixed_probe import run_mixed_probe

NAIVE = {"estimator": {"x_estimator_mode": "naive"}}


def test_naive_estimator_rejects_a_single_response_per_prompt():
    model = tiny_llama()
    E = sample_batch(model, PROMPTS, 1, 3, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="leave-one-out.*G >= 2, got G=1"):
        ProbeComponents(model, NAIVE).accumulate_sum_X(E, 2)
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.ones(3, 1), "grpo")
    # RB has no leave-one-out term: G = 1 is fine.
    rb = {"estimator": {"x_estimator_mode": "rb_residual"}}
    buf, B = ProbeComponents(model, rb).accumulate_sum_X(E, 2)
    assert B == 3 and all(torch.isfinite(t).all() for t in buf.values())


def test_empty_response_is_rejected():
    with pytest.raises(ValueError, match="response 1 of prompt 0 is empty"):
        make_probe_batch([[1, 2]], [[[3], []]], [[0.0, 0.0]], PAD)
    batch = make_probe_batch([[1, 2]], [[[3], [4]]], [[0.0, 0.0]], PAD)
    batch["attention_masks"][0, 1, -1] = 0  # a hand-built batch whose second response has no token
    with pytest.raises(ValueError, match="empty"):
        ProbeComponents(tiny_llama(), {}).accumulate_sum_X(batch, 1)


def test_model_without_trainable_parameters_is_rejected():
    model = tiny_llama().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ProbeComponents(model, {})


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.update(advantages=torch.zeros(3, 5)), r"advantages must have shape \[3, 4\]"),
        (lambda b: b.update(attention_masks=b["attention_masks"][:, :, :-1]), "attention_masks must have shape"),
        (lambda b: b.update(prompt_lens=torch.tensor([3, 1])), r"prompt_lens must have shape \[3\]"),
        (lambda b: b.update(max_lengths=torch.tensor([3, 3, 3, 3])), "max_lengths must have shape"),
        (lambda b: b.update(sequences=b["sequences"][0]), r"sequences must be \[B, G, T\]"),
        (lambda b: b.pop("max_lengths"), "missing keys"),
        (lambda b: b.update(prompt_lens=b["prompt_lens"] + torch.tensor([1, 0, 0])), "common column"),
        (lambda b: b.update(max_lengths=torch.ones(3, dtype=torch.long)), "max_lengths must be >="),
    ],
)
def test_mismatched_batch_shapes_are_rejected(mutate, message):
    model = tiny_llama()
    batch = sample_batch(model, PROMPTS, 4, 3, torch.Generator().manual_seed(0))
    mutate(batch)
    with pytest.raises(ValueError, match=message):
        ProbeComponents(model, {}).accumulate_sum_Y(batch, 2)


def test_make_probe_batch_rejects_ragged_and_mismatched_input():
    with pytest.raises(ValueError, match="G=2 responses but prompt 1 has 1"):
        make_probe_batch([[1], [2]], [[[3], [4]], [[3]]], [[0, 0], [0, 0]], PAD)
    with pytest.raises(ValueError, match="2 prompts but response_ids has 1"):
        make_probe_batch([[1], [2]], [[[3], [4]]], [[0, 0]], PAD)
    with pytest.raises(ValueError, match=r"advantages must have shape \[B, G\] = \[1, 2\]"):
        make_probe_batch([[1]], [[[3], [4]]], [[0, 0, 0]], PAD)
    with pytest.raises(ValueError, match="shorter than the longest response"):
        make_probe_batch([[1]], [[[3, 3], [4]]], [[0, 0]], PAD, max_lengths=[1])


def test_all_zero_advantages_give_exactly_zero_deltaH1():
    model = tiny_llama()
    gen = torch.Generator().manual_seed(0)
    E = sample_batch(model, PROMPTS, 4, 3, gen)
    rewards = torch.ones(len(PROMPTS), 4)  # every response equally good
    U = sample_batch(model, PROMPTS, 4, 3, gen, advantages=group_advantages(rewards, "grpo"))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    result = run_mixed_probe(model, E, U, {"ground_truth": {"enable": True}}, optimizer)
    assert result["bars_dot"] == 0.0 and result["deltaH1"] == 0.0
    assert not math.isnan(result["deltaH_true"]) and result["deltaH_true"] == 0.0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"estimator": {"x_estimator_mode": "magic"}}, "estimator.x_estimator_mode"),
        ({"estimator": {"baseline": {"mode": "regression"}}}, "estimator.baseline.mode"),
        ({"estimator": {"baseline": {"ema_decay": 1.5}}}, "estimator.baseline.ema_decay"),
        ({"probe": {"weighting_mode": "mean"}}, "probe.weighting_mode"),
        ({"probe": {"buffers_dtype": "int8"}}, "probe.buffers_dtype"),
        ({"probe": {"mb_size_prompts": 0}}, "probe.mb_size_prompts"),
        ({"batch": {"G": 0}}, "batch.G"),
        ({"generation": {"top_p": 0.0}}, "generation.top_p"),
        ({"generation": {"temperature": -1}}, "generation.temperature"),
        ({"advantage": {"estimator": "ppo"}}, "advantage.estimator"),
        ({"probe": {"no_such_key": 1}}, "no_such_key"),
    ],
)
def test_config_values_are_checked_by_key(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        resolve_config(override)
