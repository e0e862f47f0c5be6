# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests that run a real sglang Engine on CPU and check its entropy against HF recomputation.

:func:`hf_token_entropy` is the reference of every Engine test: a teacher-forced ``transformers`` forward and its own
entropy formula (``torch.log_softmax`` in float64). It calls nothing from ``treetune_verl``, so a wrong formula in
the product cannot be mirrored in its reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


@contextlib.contextmanager
def entropy_engine(
    model_path: Path | str, top_k: int = 0, mode: str = "raw", device: str = "cpu", **overrides: Any
) -> Iterator[Any]:
    """A real ``sglang.Engine`` with entropy extraction installed (seeded, quiet); shut down on exit."""
    import sglang

    from treetune_verl.sglang.engine import engine_kwargs, install

    install(top_k=top_k, mode=mode)
    engine = sglang.Engine(**engine_kwargs(str(model_path), device, random_seed=0, log_level="error", **overrides))
    try:
        yield engine
    finally:
        engine.shutdown()


def entropy_state_in_scheduler(engine: Any) -> int:
    """Requests whose entropy the scheduler process still holds (read through sglang's internal-state RPC)."""
    from treetune_verl.sglang.config import INTERNAL_STATE_KEY

    states = engine.get_server_info()["internal_states"]
    return sum(int(state[INTERNAL_STATE_KEY]) for state in states)


def run_async(engine: Any, coro):
    """Run a coroutine on the Engine's own event loop (where its TokenizerManager lives)."""
    return engine.loop.run_until_complete(coro)


def as_received(chunk: dict) -> dict:
    """A stream chunk as its consumer sees it on arrival: sglang 0.5.12 hands intermediate chunks references to its
    growing per-request lists (``output_ids``, ``output_token_logprobs``), so a chunk kept for later reads the
    final lengths; copy the lists now."""
    meta_info = {k: list(v) if isinstance(v, list) else v for k, v in chunk["meta_info"].items()}
    return {**chunk, "output_ids": list(chunk.get("output_ids") or []), "meta_info": meta_info}


async def collect_stream(engine: Any, rid: str, **request: Any) -> list[dict]:
    """All chunks of one streaming request, through the real TokenizerManager, each as received."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(rid=rid, stream=True, return_logprob=True, **request)
    return [as_received(chunk) async for chunk in engine.tokenizer_manager.generate_request(obj, None)]


async def gather(*coros):
    return await asyncio.gather(*coros)


@functools.lru_cache(maxsize=2)
def _hf_model(model_path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def hf_token_entropy(
    model_path: Path | str,
    prompt_ids: list[int],
    output_ids: list[int],
    top_k: int = 0,
    mode: str = "raw",
    temperature: float = 1.0,
) -> list[float]:
    """Independent recomputation: teacher-forced HF forward over prompt + output, entropy at each output position.

    Returns one value (nats) per output token: the entropy of the distribution the token was sampled from
    (raw: softmax(logits); tempered: softmax(logits / temperature); top-k: renormalised over the k largest).
    """
    if not output_ids:
        return []
    model = _hf_model(str(model_path))
    ids = torch.tensor([prompt_ids + output_ids[:-1]])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 :].double()  # [n_output, V]
    if mode == "tempered":
        logits = logits / temperature
    elif mode != "raw":
        raise ValueError(f"mode must be 'raw' or 'tempered', got {mode!r}")
    if top_k and top_k < logits.shape[-1]:
        logits = logits.topk(top_k, dim=-1).values  # renormalised over the k largest by the log_softmax below
    logp = torch.log_softmax(logits, dim=-1)
    return (-(logp.exp() * logp).sum(dim=-1)).tolist()


def output_token_ids(meta_info: dict) -> list[int]:
    return [token_id for _, token_id, _ in meta_info["output_token_logprobs"]]


def assert_entropy_matches_hf(
    model_path: Path | str,
    prompt_ids: list[int],
    meta_info: dict,
    top_k: int = 0,
    mode: str = "raw",
    temperature: float = 1.0,
    atol: float = 1e-4,
) -> float:
    """Check one finished request; returns the largest absolute difference (nats)."""
    entropy = meta_info["output_token_entropy"]
    ids = output_token_ids(meta_info)
    assert len(entropy) == len(ids) == meta_info["completion_tokens"], (
        len(entropy),
        len(ids),
        meta_info["completion_tokens"],
    )
    expected = hf_token_entropy(model_path, prompt_ids, ids, top_k=top_k, mode=mode, temperature=temperature)
    diff = max((abs(a - b) for a, b in zip(entropy, expected, strict=True)), default=0.0)
    assert diff <= atol, f"entropy differs from HF recomputation by {diff:.3g} nats (> {atol})"
    return diff
