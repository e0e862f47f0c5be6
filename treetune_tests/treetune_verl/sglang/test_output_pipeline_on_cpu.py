# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The whole output path in one process: real ``Scheduler`` -> real ``DetokenizerManager`` -> real (patched)
``TokenizerManager`` -> ``meta_info["output_token_entropy"]`` (sglang 0.5.6.post2, all three built by their own
``__init__`` on the tiny model; only the zmq transport between them is replaced by handing the objects over).

Two sources of scheduler outputs:

* ``scheduler_scenario`` (synthetic results, sync and overlap): every request's final and intermediate
  ``meta_info`` must hold exactly the known values of its tokens (``token_value``), aligned with its logprobs.
* the scheduler's own event loop (the body of ``event_loop_normal``: ``get_next_batch_to_run`` -> ``run_batch`` with
  the real model forward and the real patched Sampler -> ``process_batch_result``), with real KV slots and the real
  radix cache, in raw, top-k and tempered modes, with a stream, a chunked prefill and a greedy request: every
  ``meta_info`` entropy must match an independent teacher-forced HF recomputation (``engine_helpers.hf_token_entropy``,
  its own ``log_softmax``; within 1e-4 nats), one value per token, and the scheduler holds nothing afterwards.
"""

from __future__ import annotations

import pytest
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams

from treetune_tests.treetune_verl.sglang.engine_helpers import hf_token_entropy
from treetune_tests.treetune_verl.sglang.scheduler_scenario import (
    EXPECTED_FINISH,
    Scenario,
    sent_to_detokenizer,
    token_value,
)
from treetune_tests.treetune_verl.sglang.sglang_objects import make_state
from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.tokenizer_patches import META_INFO_ENTROPY_KEY, apply_tokenizer_patches
from treetune_verl.sglang.v0_5_6_post2.scheduler_patches import apply_scheduler_patches, scheduler_store

KEY = META_INFO_ENTROPY_KEY


def test_scheduler_to_meta_info_pipeline(scenario: Scenario, detokenizer_manager, tokenizer_manager):
    """Scheduler outputs -> real detokenizer -> real (patched) TokenizerManager: meta_info per request."""
    states = {
        rid: make_state(rid, stream=req.stream, return_logprob=req.return_logprob) for rid, req in scenario.reqs.items()
    }
    tokenizer_manager.rid_to_state.update(states)
    for out in scenario.outputs:
        tokenizer_manager._handle_batch_output(detokenizer_manager.handle_batch_token_id_out(out))
    assert tokenizer_manager.rid_to_state == {}  # every request finished on the tokenizer side too

    for k, (rid, req) in enumerate(scenario.reqs.items()):
        metas = [out["meta_info"] for out in states[rid].out_list]
        final = metas[-1]
        assert final["finish_reason"]["type"] == EXPECTED_FINISH[rid]
        if not req.return_logprob:
            assert KEY not in final
            continue
        n = final["completion_tokens"]
        assert final[KEY] == [token_value(k, t) for t in range(n)], rid
        assert [lp for lp, _, _ in final["output_token_logprobs"]] == [-v for v in final[KEY]]
        # every intermediate meta_info kept the prefix it was built with
        for meta in metas:
            m = meta["completion_tokens"]
            assert meta[KEY] == [token_value(k, t) for t in range(m)], (rid, m)
    assert len(states["nonstream"].out_list[-1]["meta_info"][KEY]) == 53


LOOP_CASES = {
    "raw": (EntropyConfig(), 1.0),
    "top_k": (EntropyConfig(top_k=20), 1.0),
    "tempered": (EntropyConfig(mode="tempered"), 0.7),
}


def _request(rid: str, prompt: list[int], max_new_tokens: int, temperature: float, stream: bool, vocab: int):
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    params.normalize(None)
    params.verify(vocab)
    return TokenizedGenerateReqInput(
        rid=rid,
        input_text="",
        input_ids=prompt,
        mm_inputs=None,
        sampling_params=params,
        return_logprob=True,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=stream,
    )


@pytest.mark.parametrize("case", list(LOOP_CASES))
def test_real_event_loop_entropy_matches_hf(
    case, pristine, real_scheduler, detokenizer_manager, tokenizer_manager, tiny_model_dir
):
    config, temperature = LOOP_CASES[case]
    apply_scheduler_patches(config)
    apply_tokenizer_patches()
    scheduler = real_scheduler()  # the sync loop (the overlap loop runs in the engine tests)
    vocab = scheduler.model_config.vocab_size
    assert scheduler.chunked_prefill_size == 64
    prompts = {
        "stream": [(7 * i) % vocab for i in range(3, 20)],
        "chunked": [(11 * i + 5) % vocab for i in range(100)],  # longer than one prefill chunk
        "greedy": [(13 * i + 1) % vocab for i in range(9)],
    }
    requests = [
        _request("stream", prompts["stream"], 12, temperature, stream=True, vocab=vocab),
        _request("chunked", prompts["chunked"], 10, temperature, stream=False, vocab=vocab),
        _request("greedy", prompts["greedy"], 8, 0.0, stream=False, vocab=vocab),
    ]
    states = {req.rid: make_state(req.rid, stream=req.stream) for req in requests}
    tokenizer_manager.rid_to_state.update(states)
    for req in requests:
        scheduler.handle_generate_request(req)

    sent = sent_to_detokenizer(scheduler)
    for _ in range(200):  # what event_loop_normal does between receiving requests
        if not tokenizer_manager.rid_to_state:
            break
        batch = scheduler.get_next_batch_to_run()
        scheduler.cur_batch = batch
        if batch:
            result = scheduler.run_batch(batch)
            scheduler.process_batch_result(batch, result)
        scheduler.last_batch = batch
        while sent:
            tokenizer_manager._handle_batch_output(detokenizer_manager.handle_batch_token_id_out(sent.pop(0)))
    else:
        raise AssertionError("requests did not finish in 200 scheduler steps")
    scheduler.cur_batch = None
    assert len(scheduler_store(scheduler)) == 0

    assert len(states["stream"].out_list) > 1  # streamed in several chunks
    for rid, state in states.items():
        metas = [out["meta_info"] for out in state.out_list]
        final = metas[-1]
        assert final["finish_reason"]["type"] in ("length", "stop"), final["finish_reason"]
        ids = [token_id for _, token_id, _ in final["output_token_logprobs"]]
        assert len(final[KEY]) == len(ids) == final["completion_tokens"] > 0, rid
        for meta in metas:  # each chunk's list is the prefix of the final one
            assert meta[KEY] == final[KEY][: len(meta[KEY])] and len(meta[KEY]) == len(meta["output_token_logprobs"])
        request_temperature = 1.0 if rid == "greedy" else temperature  # sglang runs greedy rows at T = 1
        expected = hf_token_entropy(
            tiny_model_dir,
            prompts[rid],
            ids,
            top_k=config.top_k or 0,
            mode=config.mode,
            temperature=request_temperature,
        )
        diff = max(abs(a - b) for a, b in zip(final[KEY], expected, strict=True))
        assert diff <= 1e-4, f"{rid}: entropy differs from the HF recomputation by {diff:.3g} nats"
