# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``ManagedOpenAIClient``: the ``openai.AsyncOpenAI`` call shape over a managed session.

Agent code written for an OpenAI endpoint runs unchanged inside a session::

    client = ManagedOpenAIClient(managed)          # instead of openai.AsyncOpenAI(base_url=...)
    reply = await client.chat.completions.create(model="any", messages=messages, tools=tools, n=1)
    call = reply.choices[0].message.tool_calls[0]  # parsed from the model's <tool_call> JSON
    messages += [reply.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "7"}]

Only the arguments that a managed session can honour are accepted; any other (``stream``, ``logprobs``, ``seed``,
...) raises ``TypeError`` naming it rather than being silently ignored. ``model`` is accepted and ignored: the
session's backend serves one model.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.managed.server import ManagedServer

_TOOL_CHOICES = (None, "auto", "none")


class _ChatCompletions:
    def __init__(self, managed: ManagedServer) -> None:
        self._managed = managed

    async def create(
        self,
        *,
        messages: list[Any],
        model: str | None = None,
        n: int | None = None,
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | None = None,
        extra_body: dict[str, Any] | None = None,
        **unsupported: Any,
    ) -> Any:
        """``client.chat.completions.create(...)``; ``extra_body`` may carry ``top_k`` (as with sglang's server)."""
        if unsupported:
            raise TypeError(f"chat.completions.create: not supported in a managed session: {sorted(unsupported)}")
        if tool_choice not in _TOOL_CHOICES:
            raise TypeError(f"chat.completions.create: tool_choice must be one of {_TOOL_CHOICES}, got {tool_choice!r}")
        extra = dict(extra_body or {})
        top_k = extra.pop("top_k", None)
        if extra:
            raise TypeError(f"chat.completions.create: extra_body keys not supported: {sorted(extra)}")
        return await self._managed.chat_completion(
            messages,
            n=n or 1,
            max_tokens=max_completion_tokens if max_completion_tokens is not None else max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            tools=tools,
            parse_tool_calls=bool(tools) and tool_choice != "none",
        )


class _Chat:
    def __init__(self, managed: ManagedServer) -> None:
        self.completions = _ChatCompletions(managed)


class _Completions:
    def __init__(self, managed: ManagedServer) -> None:
        self._managed = managed

    async def create(
        self,
        *,
        prompt: str,
        model: str | None = None,
        n: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | list[str] | None = None,
        **unsupported: Any,
    ) -> Any:
        """``client.completions.create(...)`` (plain-text prompt)."""
        if unsupported:
            raise TypeError(f"completions.create: not supported in a managed session: {sorted(unsupported)}")
        return await self._managed.completion(
            prompt, n=n or 1, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop
        )


class ManagedOpenAIClient:
    """``client.chat.completions.create`` and ``client.completions.create`` over a :class:`ManagedServer`."""

    def __init__(self, managed: ManagedServer) -> None:
        self.managed = managed
        self.chat = _Chat(managed)
        self.completions = _Completions(managed)
