# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Loading the probed policy: the HF causal LM and its tokenizer, in ``model.dtype`` on ``model.device``.

First step of the main job's path: everything after it (sampling, the probe passes, the real step) runs on this
model. ``model.path = null`` loads the packaged SmolLM2-135M-Instruct (``treetune_verl.model_cache``). The dtype names
map to torch dtypes through ``config.DTYPES``, the one map the config validates against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from treetune_verl.probe.config import DTYPES


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` if available, else ``cpu``; anything else unchanged."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_model_and_tokenizer(cfg_model: DictConfig) -> tuple[torch.nn.Module, Any, str]:
    """``(model, tokenizer, name)`` from ``model.*``; the model is in eval mode with every parameter trainable."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cfg_model.path is None:
        from treetune_verl.model_cache import smollm2_path

        path = str(smollm2_path())
    else:
        path = str(cfg_model.path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[str(cfg_model.dtype)])
    model = model.to(resolve_device(str(cfg_model.device)))
    model.requires_grad_(True)
    model.eval()
    return model, tokenizer, Path(path).name
