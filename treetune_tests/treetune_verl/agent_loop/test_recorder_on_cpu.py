# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``EntropyRecorder``: forwards to the server manager and refuses outputs without entropy, naming the fix."""

from __future__ import annotations

import pytest

from treetune_tests.treetune_verl.agent_loop.conftest import PROMPT_LENGTH, RESPONSE_LENGTH
from treetune_tests.treetune_verl.agent_loop.fakes import FakeEntropyServer
from treetune_verl.agent_loop import EntropyRecorder


async def test_recorder_refuses_missing_entropy(tiny_model_dir):
    server = FakeEntropyServer(str(tiny_model_dir), PROMPT_LENGTH, RESPONSE_LENGTH)
    recorder = EntropyRecorder(server)
    assert recorder.prompt_length == PROMPT_LENGTH  # forwarded
    with pytest.raises(RuntimeError, match="no generate"):
        recorder.take()
    with pytest.raises(RuntimeError, match="calculate_log_probs=True"):
        await recorder.generate("r", prompt_ids=[1, 2], sampling_params={"logprobs": False})
