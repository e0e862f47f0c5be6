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


async def test_recorder_keeps_the_support_of_the_last_generate():
    from types import SimpleNamespace

    from treetune_verl.agent_loop.recorder import attach_response_support

    support = [(2, 0.8, -0.2, [5, 9]), (1, 0.5, 0.0, [6]), (3, 0.9, -1.1, [7, 1, 2])]

    class Server:
        async def generate(self, *args, **kwargs):
            return SimpleNamespace(token_ids=[5, 6, 7], entropy=[0.5, 0.0, 1.0], support=support, stop_reason="stop")

    with pytest.raises(RuntimeError, match="does not carry each token's sampled support"):
        await EntropyRecorder(Server()).generate("r", prompt_ids=[1], sampling_params={"logprobs": True})
    recorder = EntropyRecorder(Server(), carries_support=True)
    await recorder.generate("r", prompt_ids=[1], sampling_params={"logprobs": True})
    assert recorder.take() == [0.5, 0.0, 1.0]
    assert recorder.take_support() == support and recorder.take_support() is None  # taken once
    output = SimpleNamespace(response_ids=[5, 6], extra_fields={})
    attach_response_support(output, support, response_length=2)  # truncated as verl truncates the response
    assert output.extra_fields["response_support"] == support[:2]
    with pytest.raises(RuntimeError, match="support/response misaligned"):
        attach_response_support(SimpleNamespace(response_ids=[5, 6, 7, 8], extra_fields={}), support, 4)
