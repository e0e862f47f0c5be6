# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main job's batches: arithmetic prompts → sampled responses → rewards → advantages → probe batch."""

from __future__ import annotations

import random

import torch

from treetune_verl.probe.arithmetic import arithmetic_prompts
from treetune_verl.probe.batch import validate_probe_batch
from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.model_loading import load_model_and_tokenizer
from treetune_verl.probe.task_sampler import ArithmeticBatchSampler


def _sampler(model_dir, seed: int = 0) -> ArithmeticBatchSampler:
    cfg = resolve_config(
        {
            "model": {"path": str(model_dir), "device": "cpu"},
            "batch": {"G": 3},
            "generation": {"max_new_tokens": 5},
        }
    )
    model, tokenizer, _ = load_model_and_tokenizer(cfg.model)
    return ArithmeticBatchSampler(model, tokenizer, cfg, seed)


def test_batches_have_the_probe_layout_with_the_budget_as_L_max(char_llama_dir):
    sampler = _sampler(char_llama_dir)
    batch, info = sampler.sample(4)
    B, G, P = validate_probe_batch(batch)
    assert (B, G) == (4, 3)
    assert batch["max_lengths"].tolist() == [5, 5, 5, 5]
    assert 0.0 <= info["mean_reward"] <= 1.0
    assert set(info["example"]) == {"prompt", "response", "reward"}
    assert sampler.eos_token_ids == [1] and sampler.pad_token_id == 0  # the fixture's <eos> and <pad>


def test_raw_prompt_is_question_newline_prefill(char_llama_dir):
    """Without a chat template the prompt is the question, a newline and the pre-filled answer start."""
    sampler = _sampler(char_llama_dir)
    (item,) = arithmetic_prompts(1, 9, random.Random(0))
    assert sampler.tokenizer.decode(sampler.encode(item)) == f"{item.question}\n{item.prefill}"


def test_one_seed_fixes_every_batch(char_llama_dir):
    first, second = _sampler(char_llama_dir, seed=3), _sampler(char_llama_dir, seed=3)
    for _ in range(2):
        a, b = first.sample(2)[0], second.sample(2)[0]
        assert all(torch.equal(a[key], b[key]) for key in a)
