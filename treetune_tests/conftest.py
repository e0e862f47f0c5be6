# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: the packaged SmolLM2 and the tiny random Qwen2, built once per cache directory."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from treetune_tests.tiny_model import build_tiny_qwen2
    from treetune_verl.model_cache import models_dir

    return build_tiny_qwen2(models_dir() / "tiny-qwen2-seed0", seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from treetune_verl.model_cache import smollm2_path

    return smollm2_path()
