# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""OpenAI-shaped results of a managed call, built from ``openai``'s own types (installed with sglang).

``finish_reason`` is the engine's (``"stop"``, ``"length"``), ``"tool_calls"`` when the reply was parsed into tool
calls, or ``"abort"`` (not one of OpenAI's values: the objects are built with ``model_construct`` at that level so
that an aborted turn is not reported as a normal stop).
"""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice

MODEL_NAME = "treetune-managed"


def chat_completion(
    messages: list[dict[str, Any]], finish_reasons: list[str | None], prompt_tokens: int, completion_tokens: int
) -> ChatCompletion:
    """One ``ChatCompletion`` whose ``choices[i].message`` is ``messages[i]`` (role assistant, content, tool_calls)."""
    choices = [
        Choice.model_construct(
            index=i,
            finish_reason=reason,
            logprobs=None,
            message=ChatCompletionMessage.model_validate(message),
        )
        for i, (message, reason) in enumerate(zip(messages, finish_reasons, strict=True))
    ]
    return ChatCompletion.model_construct(
        id=f"chatcmpl-{uuid4().hex}",
        object="chat.completion",
        created=int(time.time()),
        model=MODEL_NAME,
        choices=choices,
        usage=_usage(prompt_tokens, completion_tokens),
    )


def text_completion(
    texts: list[str], finish_reasons: list[str | None], prompt_tokens: int, completion_tokens: int
) -> Completion:
    choices = [
        CompletionChoice.model_construct(index=i, finish_reason=reason, logprobs=None, text=text)
        for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
    ]
    return Completion.model_construct(
        id=f"cmpl-{uuid4().hex}",
        object="text_completion",
        created=int(time.time()),
        model=MODEL_NAME,
        choices=choices,
        usage=_usage(prompt_tokens, completion_tokens),
    )


def _usage(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )
