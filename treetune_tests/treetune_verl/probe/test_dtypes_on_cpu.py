# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Model and buffer dtypes: a bf16 model runs under autocast with fp32 buffers; buffers_dtype is honoured."""

from __future__ import annotations

import torch

from treetune_tests.treetune_verl.probe.tiny import PROMPTS, flat_buffer, sample_batch, tiny_llama
from treetune_verl.probe.components import ProbeComponents

CONFIG = {"generation": {"temperature": 1.0, "top_p": 1.0}, "estimator": {"x_estimator_mode": "rb_residual"}}


def test_bf16_model_gives_fp32_buffers_close_to_the_fp32_model():
    model = tiny_llama()
    E = sample_batch(model, PROMPTS, 8, 3, torch.Generator().manual_seed(0))
    reference, _ = ProbeComponents(model, CONFIG).accumulate_sum_X(E, 2)
    bf16 = tiny_llama().to(torch.bfloat16)
    buf, _ = ProbeComponents(bf16, CONFIG).accumulate_sum_X(E, 2)
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in buf.values())
    a, b = flat_buffer(model, reference), flat_buffer(bf16, buf)
    assert torch.isfinite(b).all()
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.98  # bf16 weights and activations: ~3 digits


def test_buffers_dtype_is_honoured():
    model = tiny_llama()
    E = sample_batch(model, PROMPTS, 4, 3, torch.Generator().manual_seed(0))
    buf, _ = ProbeComponents(model, {**CONFIG, "probe": {"buffers_dtype": "float64"}}).accumulate_sum_X(E, 2)
    assert all(t.dtype == torch.float64 for t in buf.values())
