# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Probe test fixtures: seeded single-threaded torch, and the character-level tiny Llama folder."""

import os

import pytest
import torch

from treetune_tests.tiny_model import build_char_llama

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    # The tiny models are overhead-bound; one thread avoids oversubscribing a shared 2-core machine.
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def char_llama_dir(tmp_path):
    """A character-level tokenizer (no chat template) and a 1-layer Llama over its 73 tokens, saved as an HF folder."""
    return build_char_llama(tmp_path / "tiny-char-llama")
