# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Generation on the in-process patched sglang Engine, each response handed over the moment it completes.

Requests go to the Engine's own event loop (``Engine.async_generate``, where its TokenizerManager lives) with at
most ``max_in_flight`` outstanding, so a prompt set of any size is neither tokenized nor queued all at once, and the
scheduler always has enough waiting to fill its running batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from treetune_verl.generation.inputs import PromptItem


@dataclass(frozen=True)
class GenerationRequest:
    item: PromptItem
    sample_index: int
    input_ids: list[int]  # the chat-templated prompt


def stream_generate(
    engine: Any,
    requests: Iterable[GenerationRequest],
    sampling_params: dict[str, Any],
    on_output: Callable[[GenerationRequest, dict[str, Any]], None],
    max_in_flight: int = 32,
) -> None:
    """Generate every request with ``return_logprob=True`` (so with entropy); ``on_output(request, output)`` runs,
    on the Engine's loop, as each completes (in completion order). Outstanding requests are cancelled (and so aborted
    in sglang) if ``on_output`` raises or the run is interrupted."""
    if max_in_flight < 1:
        raise ValueError(f"engine.max_in_flight must be >= 1, got {max_in_flight}")
    engine.loop.run_until_complete(_run(engine, iter(requests), sampling_params, on_output, max_in_flight))


async def _run(engine, requests, sampling_params, on_output, max_in_flight) -> None:
    async def one(request: GenerationRequest) -> tuple[GenerationRequest, dict[str, Any]]:
        output = await engine.async_generate(
            input_ids=request.input_ids, sampling_params=dict(sampling_params), return_logprob=True
        )
        return request, output

    pending: set[asyncio.Task] = set()

    def refill() -> None:
        while len(pending) < max_in_flight:
            request = next(requests, None)
            if request is None:
                return
            pending.add(asyncio.ensure_future(one(request)))

    try:
        refill()
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.difference_update(done)
            for task in done:
                on_output(*task.result())
            refill()
    finally:
        for task in pending:
            task.cancel()
