# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""GPU smoke test: a real sglang Engine on CUDA with a small public model, full-vocabulary and top-k entropy.

Skips without CUDA. Model: ``$TREETUNE_SMOKE_MODEL`` (default ``Qwen/Qwen2.5-0.5B-Instruct``, needs the hub or a
local copy). Checks one entropy per generated token, 0 <= H <= log(V) (log k for top-k), and an HF cross-check
of every value (fp32 HF forward on CPU against the engine's bf16 numbers, so within 5e-2 nats).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from treetune_tests.treetune_verl.sglang.engine_helpers import entropy_engine, hf_token_entropy, output_token_ids

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the CPU Engine tests cover CPU)"),
]

MODEL = os.environ.get("TREETUNE_SMOKE_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
GPU_TOLERANCE = 5e-2  # nats: bf16 engine vs fp32 HF recomputation


@pytest.mark.parametrize("top_k", [0, 10])
def test_entropy_on_gpu_engine(top_k):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Explain entropy in one sentence."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    with entropy_engine(MODEL, top_k=top_k, device="cuda", mem_fraction_static=0.3) as engine:
        out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 16}, return_logprob=True)
    meta = out["meta_info"]
    entropy = meta["output_token_entropy"]
    assert len(entropy) == meta["completion_tokens"] > 0
    bound = math.log(top_k) if top_k else math.log(AutoConfig.from_pretrained(MODEL).vocab_size)
    assert all(0.0 <= h <= bound + 1e-4 for h in entropy)
    expected = hf_token_entropy(MODEL, prompt, output_token_ids(meta), top_k=top_k)
    assert max(abs(a - b) for a, b in zip(entropy, expected, strict=True)) < GPU_TOLERANCE
