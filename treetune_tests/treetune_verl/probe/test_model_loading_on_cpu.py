# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Loading the probed model: dtype by name, eval mode, every parameter trainable."""

from __future__ import annotations

import pytest
import torch

from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.model_loading import load_model_and_tokenizer


@pytest.mark.parametrize(("name", "dtype"), [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_model_is_loaded_in_the_configured_dtype_ready_to_probe(char_llama_dir, name, dtype):
    cfg = resolve_config({"model": {"path": str(char_llama_dir), "device": "cpu", "dtype": name}})
    model, tokenizer, model_name = load_model_and_tokenizer(cfg.model)
    assert model_name == "tiny-char-llama"
    assert all(p.dtype == dtype and p.device.type == "cpu" and p.requires_grad for p in model.parameters())
    assert not model.training
    assert tokenizer.decode(tokenizer("1 + 2 =", add_special_tokens=False)["input_ids"]) == "1 + 2 ="


def test_model_dtype_names_are_validated_by_key():
    with pytest.raises(ValueError, match=r"model\.dtype must be one of \['float32', 'bfloat16', 'float16'\]"):
        resolve_config({"model": {"dtype": "float64"}})
    assert resolve_config({"probe": {"buffers_dtype": "float64"}}).probe.buffers_dtype == "float64"
