# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Real ``sglang.Engine`` on CPU (tiny random Qwen2 and SmolLM2-135M) with entropy extraction installed.

The same file runs on both stacks (sglang 0.5.6.post2 and 0.5.12: whichever the environment has). Every finished
request must carry one entropy per completion token, equal (within 1e-4 nats) to an independent
teacher-forced HF recomputation, in raw, top-k and tempered (T=0.7) modes, with overlap scheduling on and off;
streams, n>1, concurrent requests, stop-token/EOS and length finishes, chunked prefill, and aborts (running and
waiting, and by session prefix as over-sampling sends them), batches mixing requests with and without logprobs and
incremental streaming (0.5.12) are all exercised; afterwards the scheduler holds no entropy state.
"""

from __future__ import annotations

import asyncio
import dataclasses
from importlib.metadata import version
from pathlib import Path

import pytest

from treetune_tests.treetune_verl.sglang.engine_helpers import (
    as_received,
    assert_entropy_matches_hf,
    collect_stream,
    entropy_engine,
    entropy_state_in_scheduler,
    run_async,
)

pytestmark = [pytest.mark.engine]


@dataclasses.dataclass(frozen=True)
class EngineCase:
    model: str  # "tiny" | "smollm2"
    top_k: int = 0
    mode: str = "raw"
    temperature: float = 1.0
    overlap: bool = True

    @property
    def id(self) -> str:
        return f"{self.model}-{self.mode}-k{self.top_k}-T{self.temperature}-{'overlap' if self.overlap else 'sync'}"


CASES = [
    EngineCase("tiny", overlap=False),
    EngineCase("tiny", overlap=True),
    EngineCase("tiny", top_k=20, overlap=True),
    EngineCase("tiny", mode="tempered", temperature=0.7, overlap=False),
    EngineCase("smollm2", overlap=True),
    EngineCase("smollm2", top_k=20, overlap=False),
    EngineCase("smollm2", mode="tempered", temperature=0.7, overlap=True),
]


@dataclasses.dataclass
class RunningEngine:
    case: EngineCase
    engine: object
    model_path: Path
    prompts: list[list[int]]
    stop_token_ids: list[int]

    def check(self, prompt_ids: list[int], meta_info: dict, temperature: float | None = None) -> float:
        temperature = self.case.temperature if temperature is None else temperature
        return assert_entropy_matches_hf(
            self.model_path,
            prompt_ids,
            meta_info,
            top_k=self.case.top_k,
            mode=self.case.mode,
            temperature=temperature if temperature > 0 else 1.0,  # sglang runs greedy requests at T=1
        )


def _prompts(model_path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    questions = [
        "What is the capital of France?",
        "Name three colours.",
        "What is 7 plus 5? Answer with a number.",
        "Write one sentence about entropy. " * 12,  # long: crosses the chunked-prefill boundary
    ]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in questions
    ]


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def running(request, tiny_model_dir, smollm2_dir):
    case: EngineCase = request.param
    model_path = tiny_model_dir if case.model == "tiny" else smollm2_dir
    prompts = _prompts(model_path)
    assert max(len(p) for p in prompts) > 32
    with entropy_engine(
        model_path,
        top_k=case.top_k,
        mode=case.mode,
        disable_overlap_schedule=not case.overlap,
        chunked_prefill_size=32,
    ) as engine:
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(model_path).vocab_size
        # Half the vocabulary as stop tokens: a sampled request stops within a few tokens (a "stop" finish).
        yield RunningEngine(case, engine, model_path, prompts, stop_token_ids=list(range(vocab // 2)))


def test_non_stream_concurrent_batch(running: RunningEngine):
    T = running.case.temperature
    params = [
        {"max_new_tokens": 12, "temperature": T},
        {"max_new_tokens": 64, "temperature": T, "stop_token_ids": running.stop_token_ids},
        {"max_new_tokens": 24, "temperature": 0.0},
        {"max_new_tokens": 9, "temperature": T, "top_p": 0.9},
    ]
    outs = running.engine.generate(input_ids=running.prompts, sampling_params=params, return_logprob=True)
    finishes = [o["meta_info"]["finish_reason"]["type"] for o in outs]
    # SmolLM2 may end a short answer with EOS ("stop") before its budget; 9 tokens of a long essay cannot.
    assert finishes[1] == "stop" and finishes[3] == "length", finishes
    assert set(finishes) <= {"stop", "length"}, finishes
    for prompt, param, out in zip(running.prompts, params, outs, strict=True):
        running.check(prompt, out["meta_info"], temperature=param["temperature"])


def test_parallel_sampling_n_greater_than_one(running: RunningEngine):
    prompt = running.prompts[2]
    outs = running.engine.generate(
        input_ids=prompt,
        sampling_params={"max_new_tokens": 10, "temperature": running.case.temperature, "n": 3},
        return_logprob=True,
    )
    assert len(outs) == 3
    for out in outs:
        running.check(prompt, out["meta_info"])


ABORTED_BUDGET = 900  # tokens; fits both models' context (tiny: 1024 positions) after the prompt


def test_streams_with_abort_of_running_and_waiting_requests(running: RunningEngine):
    engine, T = running.engine, running.case.temperature

    async def stream_and_abort_after(rid: str, prompt: list[int], n_chunks: int) -> list[dict]:
        chunks = []
        # A budget the request cannot reach before the abort lands, even on a loaded machine: with 200 tokens the
        # tiny model's request once ended by "length" between the third chunk and the abort (CI of 6a1be95).
        # ignore_eos: no "stop" finish either.
        sampling = {"max_new_tokens": ABORTED_BUDGET, "temperature": T, "ignore_eos": True}
        obj_kwargs = {"input_ids": prompt, "sampling_params": sampling}
        from sglang.srt.managers.io_struct import GenerateReqInput

        obj = GenerateReqInput(rid=rid, stream=True, return_logprob=True, **obj_kwargs)
        async for chunk in engine.tokenizer_manager.generate_request(obj, None):
            chunks.append(as_received(chunk))
            if len(chunks) == n_chunks:
                engine.tokenizer_manager.abort_request(rid=rid)
        return chunks

    async def main():
        streams = [
            collect_stream(engine, f"s{i}", input_ids=p, sampling_params={"max_new_tokens": 14, "temperature": T})
            for i, p in enumerate(running.prompts)
        ]
        # max_running_requests=8: the 9th-10th of these wait in the queue; one of them is aborted there.
        waiting = [
            collect_stream(engine, f"w{i}", input_ids=running.prompts[0], sampling_params={"max_new_tokens": 30})
            for i in range(4)
        ]
        aborted = stream_and_abort_after("abort-running", running.prompts[1], n_chunks=3)

        async def abort_waiting_soon():
            await asyncio.sleep(0)
            engine.tokenizer_manager.abort_request(rid="w3")

        return await asyncio.gather(*streams, *waiting, aborted, abort_waiting_soon(), return_exceptions=True)

    results = run_async(engine, main())
    assert not [r for r in results if isinstance(r, BaseException)], results
    streamed, waiting, aborted = results[:4], results[4:8], results[8]

    for prompt, chunks in zip(running.prompts, streamed, strict=True):
        # Every chunk's entropy list is the cumulative prefix of the final one, as for logprobs.
        final = chunks[-1]["meta_info"]
        for chunk in chunks:
            entropy = chunk["meta_info"]["output_token_entropy"]
            assert len(entropy) == len(chunk["meta_info"]["output_token_logprobs"])
            assert entropy == final["output_token_entropy"][: len(entropy)]
        assert final["finish_reason"]["type"] in ("length", "stop")  # SmolLM2 may emit EOS within 14 tokens
        running.check(prompt, final)

    final = aborted[-1]["meta_info"]
    assert final["finish_reason"]["type"] == "abort"
    assert 3 <= len(final["output_token_entropy"]) < ABORTED_BUDGET
    running.check(running.prompts[1], final)

    for chunks in waiting:
        final = chunks[-1]["meta_info"]
        assert len(final["output_token_entropy"]) == len(final["output_token_logprobs"])
        if final["finish_reason"]["type"] != "abort":
            running.check(running.prompts[0], final, temperature=1.0)


def test_no_entropy_without_logprobs_and_no_state_left(running: RunningEngine):
    out = running.engine.generate(input_ids=running.prompts[0], sampling_params={"max_new_tokens": 5})
    assert "output_token_entropy" not in out["meta_info"]
    assert entropy_state_in_scheduler(running.engine) == 0


def test_batch_mixing_requests_with_and_without_logprobs(running: RunningEngine):
    """Rows without logprobs in the same batches as rows with them: only the latter carry entropy, each aligned with
    its own tokens (sglang 0.5.12 slices its customized_info per output by position: a row without values would
    shift every later row)."""
    T = running.case.temperature
    wants = [False, True, False, True]
    outs = running.engine.generate(
        input_ids=running.prompts,
        sampling_params=[{"max_new_tokens": 10 + 3 * i, "temperature": T} for i in range(4)],
        return_logprob=wants,
    )
    for prompt, want, out in zip(running.prompts, wants, outs, strict=True):
        if want:
            running.check(prompt, out["meta_info"])
        else:
            assert "output_token_entropy" not in out["meta_info"]


def test_abort_by_session_prefix(running: RunningEngine):
    """The scoped abort over-sampling sends (one ``AbortReq`` whose rid is a session prefix, matched by prefix in the
    scheduler): every request of that session ends as an abort with its partial tokens' entropy aligned; the other
    session's requests finish and match HF; no state is left."""
    from sglang.srt.managers.io_struct import AbortReq

    engine, T = running.engine, running.case.temperature
    budget = 900  # never reached (tiny model context 1024): the abort is sent once each stream has sent 3 chunks
    started = [asyncio.Event(), asyncio.Event()]

    async def stream(rid: str, prompt: list[int], max_new_tokens: int, started: asyncio.Event | None) -> list[dict]:
        from sglang.srt.managers.io_struct import GenerateReqInput

        params = {"max_new_tokens": max_new_tokens, "temperature": T, "ignore_eos": started is not None}
        obj = GenerateReqInput(rid=rid, stream=True, return_logprob=True, input_ids=prompt, sampling_params=params)
        chunks = []
        async for chunk in engine.tokenizer_manager.generate_request(obj, None):
            chunks.append(as_received(chunk))
            if started is not None and len(chunks) == 3:
                started.set()
        return chunks

    async def abort_session_once_running(session: str):
        await asyncio.gather(*(event.wait() for event in started))
        engine.tokenizer_manager.send_to_scheduler.send_pyobj(AbortReq(rid=session))

    async def main():
        aborted = [stream(f"sessA_{i}_turn0", running.prompts[i], budget, started[i]) for i in range(2)]
        kept = [stream(f"sessB_{i}_turn0", running.prompts[i], 8, None) for i in range(2)]
        return await asyncio.gather(*aborted, *kept, abort_session_once_running("sessA_"))

    results = run_async(engine, main())
    for i, chunks in enumerate(results[:2]):
        final = chunks[-1]["meta_info"]
        assert final["finish_reason"]["type"] == "abort", final["finish_reason"]
        assert 3 <= len(final["output_token_entropy"]) < budget
        running.check(running.prompts[i], final)
    for i, chunks in enumerate(results[2:4]):
        final = chunks[-1]["meta_info"]
        assert final["finish_reason"]["type"] in ("length", "stop")
        running.check(running.prompts[i], final)
    assert entropy_state_in_scheduler(engine) == 0


@pytest.mark.skipif(version("sglang") == "0.5.6.post2", reason="incremental_streaming_output is new in sglang 0.5.12")
def test_incremental_streaming(tiny_model_dir):
    """``incremental_streaming_output``: each chunk carries only its new tokens; its entropy is sliced with its
    logprobs, and the chunks put together equal the HF recomputation."""
    prompt = _prompts(tiny_model_dir)[0]
    with entropy_engine(tiny_model_dir, incremental_streaming_output=True) as engine:
        chunks = run_async(
            engine, collect_stream(engine, "inc", input_ids=prompt, sampling_params={"max_new_tokens": 12})
        )
        assert entropy_state_in_scheduler(engine) == 0
    entropy, logprobs = [], []
    for chunk in chunks:
        meta = chunk["meta_info"]
        assert len(meta["output_token_entropy"]) == len(meta["output_token_logprobs"]) == len(chunk["output_ids"])
        entropy += meta["output_token_entropy"]
        logprobs += meta["output_token_logprobs"]
    assert len(chunks) > 1 and len(entropy) == 12
    joined = {"output_token_entropy": entropy, "output_token_logprobs": logprobs, "completion_tokens": len(entropy)}
    assert_entropy_matches_hf(tiny_model_dir, prompt, joined)
