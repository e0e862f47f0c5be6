# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the managed-session tests: the real SmolLM2 tokenizer, and the stand-in verl server of fakes.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture
def fake_server(tiny_model_dir):
    """verl's server manager stand-in (scripted by the first user message, ``"plan: tool text"``; tiny ChatML
    tokenizer): the real small model cannot be made to emit a tool call on demand. Imported here: it needs verl
    0.7.1, and the Engine tests of this folder also run on the current stack."""
    from treetune_tests.treetune_verl.agent_loop.fakes import FakeEntropyServer

    return FakeEntropyServer(str(tiny_model_dir), prompt_length=64, response_length=128)
