# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""An agent written against the OpenAI client's call shape, with one tool call, through ``ManagedOpenAIClient``.

Backend: ``VerlBackend`` over the agent-loop tests' stand-in server (``fakes.FakeEntropyServer``: the tiny model's real
ChatML tokenizer, scripted replies, a known entropy per token), because the real 135M model does not emit a tool
call on demand. Checked: the tool call is parsed into OpenAI ``tool_calls``; the model's tool-call tokens are trained
on (mask 1, served logprobs / entropy), the tool's tokens are masked (mask 0, sentinels); the sequence is exactly
what the server was sent plus what it returned.
"""

from __future__ import annotations

import asyncio

import pytest

from treetune_tests.treetune_verl.agent_loop.fakes import TOOL_CALL, fake_entropy
from treetune_tests.treetune_verl.managed.agents import openai_tool_agent
from treetune_verl.managed import MASKED_LOGPROB, MASKED_TOKEN_ID, ManagedOpenAIClient, ManagedServer, VerlBackend


class Recording:
    """Forwards to the stand-in server and keeps every (prompt_ids, output) it served."""

    def __init__(self, server):
        self.server, self.calls = server, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        output = await self.server.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        self.calls.append((list(prompt_ids), output))
        return output


def run_agent(fake_server, messages):
    recording = Recording(fake_server)

    async def main():
        async with ManagedServer(
            VerlBackend(recording, context_length=192), tokenizer=fake_server.tokenizer
        ) as managed:
            await openai_tool_agent(managed, messages)
            return managed

    return asyncio.run(main()), recording


def test_openai_shaped_tool_agent_masks_tool_tokens(fake_server):
    managed, recording = run_agent(fake_server, [{"role": "user", "content": "plan: tool text"}])
    [node] = managed.get_state()["nodes"]
    assert len(recording.calls) == 2
    (prompt_1, out_1), (prompt_2, out_2) = recording.calls
    tokenizer = fake_server.tokenizer
    assert tokenizer.decode(out_1.token_ids, skip_special_tokens=True) == TOOL_CALL

    # the sequence is exactly what the server saw and returned, nothing re-tokenized
    assert prompt_2[: len(prompt_1) + len(out_1.token_ids)] == prompt_1 + list(out_1.token_ids)
    assert node.tokens == prompt_2 + list(out_2.token_ids)
    (s1, e1), (s2, e2) = node.metadata["turns"]
    assert (s1, e1, s2, e2) == (len(prompt_1), len(prompt_1) + len(out_1.token_ids), len(prompt_2), len(node.tokens))

    # model tokens (the tool call included) trained on, with the served values; everything else masked
    expected_mask = [0] * s1 + [1] * (e1 - s1) + [0] * (s2 - e1) + [1] * (e2 - s2)
    assert node.loss_mask == expected_mask
    served = [fake_entropy(prompt_1, k) for k in range(e1 - s1)] + [fake_entropy(prompt_2, k) for k in range(e2 - s2)]
    assert [h for h, m in zip(node.entropy, node.loss_mask, strict=True) if m] == served
    served_logprobs = list(out_1.log_probs) + list(out_2.log_probs)
    assert [lp for lp, m in zip(node.logprobs, node.loss_mask, strict=True) if m] == served_logprobs
    assert all(t == MASKED_TOKEN_ID for t, m in zip(node.masked_tokens, node.loss_mask, strict=True) if not m)
    assert all(lp == MASKED_LOGPROB for lp, m in zip(node.logprobs, node.loss_mask, strict=True) if not m)
    assert all(h == 0.0 for h, m in zip(node.entropy, node.loss_mask, strict=True) if not m)

    # the masked span between the turns holds the tool's result as the template renders a tool message
    between = tokenizer.decode(node.tokens[e1:s2])
    assert "7" in between and "tool" in between, between
    assert between.endswith("<|im_start|>assistant\n")
    messages = node.metadata["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 3, "b": 4}'}


def test_negative_control_without_tool_call_one_turn_only(fake_server):
    """The same agent on a plan without a tool call makes one call: the two-turn checks above are not vacuous."""
    managed, recording = run_agent(fake_server, [{"role": "user", "content": "plan: text"}])
    [node] = managed.get_state()["nodes"]
    assert len(recording.calls) == 1 and len(node.metadata["turns"]) == 1


def test_adapter_refuses_what_it_cannot_honour(fake_server):
    client = ManagedOpenAIClient(ManagedServer(VerlBackend(fake_server, 192), tokenizer=fake_server.tokenizer))
    messages = [{"role": "user", "content": "plan: text"}]
    with pytest.raises(TypeError, match=r"\['logprobs', 'stream'\]"):
        asyncio.run(client.chat.completions.create(model="m", messages=messages, stream=True, logprobs=True))
    with pytest.raises(TypeError, match="tool_choice"):
        asyncio.run(client.chat.completions.create(model="m", messages=messages, tool_choice="required"))


def test_openai_http_client_is_refused():
    """An OpenAI endpoint returns text, not the sampled ids / logprobs / entropy: refused by default."""
    import openai

    with pytest.raises(TypeError, match="AsyncOpenAI is not a managed-session backend"):
        ManagedServer(openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9"), tokenizer=object())


def test_prompt_longer_than_context_is_refused_with_lengths(fake_server):
    managed = ManagedServer(VerlBackend(fake_server, context_length=20), tokenizer=fake_server.tokenizer)
    with pytest.raises(ValueError, match=r"prompt of \d+ tokens leaves no room .* context of 20 tokens"):
        asyncio.run(managed.chat_completion([{"role": "user", "content": "plan: text " * 10}]))
    assert fake_server.calls == 0
