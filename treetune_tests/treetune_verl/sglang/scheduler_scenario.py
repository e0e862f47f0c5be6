# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Many scheduler steps with known per-token entropy, through a real (patched) ``Scheduler``'s result handlers.

The model forward is the only thing replaced: each step hands the real ``process_batch_result_prefill`` /
``process_batch_result_decode`` a real ``GenerationBatchResult`` whose ``logits_output`` carries the entropy
``EntropySampler`` would attach. The value fed for token ``t`` of request ``k`` is :func:`token_value` (exact in
float32, unique), so every slice the scheduler sends can be checked exactly. Used by ``test_scheduler_patches_on_cpu``
(what the scheduler sends) and ``test_output_pipeline_on_cpu`` (what reaches ``meta_info``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers import scheduler_output_processor_mixin as mixin_mod
from sglang.srt.managers.io_struct import AbortReq, BatchTokenIDOutput
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from treetune_tests.treetune_verl.sglang.sglang_objects import EOS, TreeCache, make_req
from treetune_verl.sglang.sampler import LOGITS_OUTPUT_ENTROPY_ATTR
from treetune_verl.sglang.v0_5_6_post2.scheduler_patches import scheduler_store


def token_value(req_index: int, position: int) -> float:
    """The entropy fed for the token at ``position`` of request ``req_index``: exact in float32, unique, > 0."""
    return 0.25 + req_index + position / 64


SENTINEL = -7.0  # fed for rows that must not get a value (no real entropy is negative)


@dataclasses.dataclass
class Sent:
    """One request's slice of one ``BatchTokenIDOutput``."""

    output_ids: list[int]
    logprobs: list[float] | None
    entropy: list[float]
    finish: dict | None


def sent_to_detokenizer(scheduler: Scheduler) -> list[Any]:
    """What the scheduler's real ``SenderWrapper`` to the detokenizer sent (its socket is a ``CaptureSocket``)."""
    return scheduler.send_to_detokenizer.socket.sent


def sent_to_tokenizer(scheduler: Scheduler) -> list[Any]:
    return scheduler.send_to_tokenizer.socket.sent


class SchedulerRun:
    """Feeds batches to the real (patched) result handlers the way sglang's event loops do.

    Each step builds a real ``ScheduleBatch`` and a ``GenerationBatchResult`` whose ``logits_output`` carries
    ``next_token_entropy`` (what ``EntropySampler`` attaches) and ``next_token_logprobs``. A live row of request
    ``k`` about to get its token number ``t`` is fed ``token_value(k, t)`` as entropy and its negation as logprob;
    rows that get no token (a chunk that is not the last; under overlap, a request finished or retracted after the
    batch was launched) are fed :data:`SENTINEL`. With overlap, the next batch is formed *before* the current result
    is processed, as in ``event_loop_overlap``: requests finishing in this step come back once more as finished rows.

    The scheduler's ``tree_cache`` is wrapped in a :class:`~sglang_objects.TreeCache`: these requests never had KV
    slots to free.
    """

    def __init__(self, scheduler: Scheduler, reqs: list[Req]) -> None:
        self.scheduler = scheduler
        scheduler.tree_cache = TreeCache(scheduler.tree_cache)
        self.index = {req.rid: k for k, req in enumerate(reqs)}
        self.overlap = scheduler.enable_overlap
        self.steps = 0

    def _token(self, req: Req, position: int) -> int:
        if req.rid == "eos" and position == 2:
            return EOS
        return 10 + (7 * self.index[req.rid] + position) % 50

    def _result(self, reqs: list[Req]) -> GenerationBatchResult:
        ids, entropy = [], []
        for req in reqs:
            live = not (req.finished() or req.is_retracted) and req.is_chunked == 0
            position = len(req.output_ids)
            ids.append(self._token(req, position) if live else 0)
            entropy.append(token_value(self.index[req.rid], position) if live else SENTINEL)
        output = LogitsProcessorOutput(
            next_token_logits=None, next_token_logprobs=-torch.tensor(entropy, dtype=torch.float32)
        )
        setattr(output, LOGITS_OUTPUT_ENTROPY_ATTR, torch.tensor(entropy, dtype=torch.float32))
        prompt_lens = [len(req.origin_input_ids) for req in reqs]
        return GenerationBatchResult(
            logits_output=output,
            next_token_ids=torch.tensor(ids, dtype=torch.int64),
            # logprob start == input length: output logprobs only (sglang's default logprob_start_len)
            extend_input_len_per_req=prompt_lens,
            extend_logprob_start_len_per_req=prompt_lens,
            copy_done=SimpleNamespace(synchronize=lambda: None) if self.overlap else None,
        )

    def _step(self, handler: Callable[[ScheduleBatch, GenerationBatchResult], Any], reqs: list[Req]) -> list[Req]:
        self.steps += 1
        goes_on = [r for r in reqs if r.is_chunked == 0]  # a chunked request continues in a later prefill
        launched_next = [r for r in goes_on if not r.finished()]
        batch = ScheduleBatch(reqs=list(reqs), return_logprob=True, spec_algorithm=SpeculativeAlgorithm.NONE)
        batch.enable_overlap = self.overlap
        handler(batch, self._result(reqs))
        return launched_next if self.overlap else [r for r in goes_on if not r.finished()]

    def prefill(self, reqs: list[Req]) -> list[Req]:
        return self._step(self.scheduler.process_batch_result_prefill, reqs)

    def decode(self, reqs: list[Req]) -> list[Req]:
        return self._step(self.scheduler.process_batch_result_decode, reqs)


def sends_by_rid(outputs: list[Any]) -> dict[str, list[Sent]]:
    """Split the captured ``BatchTokenIDOutput``s into per-request slices, checking each batch's shape."""
    sends: dict[str, list[Sent]] = {}
    for out in outputs:
        assert isinstance(out, BatchTokenIDOutput)
        assert len(out.output_token_entropy_val) == len(out.rids)
        for i, rid in enumerate(out.rids):
            sends.setdefault(rid, []).append(
                Sent(
                    out.output_ids[i],
                    out.output_token_logprobs_val[i] if out.output_token_logprobs_val is not None else None,
                    out.output_token_entropy_val[i],
                    out.finished_reasons[i],
                )
            )
    return sends


@dataclasses.dataclass
class Scenario:
    reqs: dict[str, Req]
    outputs: list[BatchTokenIDOutput]
    scheduler: Scheduler
    store_after_first_prefill: dict[str, bool]


# rid -> sizes of its successive sends (same with overlap on and off: overlap only adds skipped rows)
EXPECTED_SEND_SIZES = {
    "stream1": [1, 1, 1, 1],  # stream, stream_interval 1: every token; length finish at 4
    "stream3": [1, 3, 3],  # stream, stream_interval 3: at 1 and 4 tokens, then the finish at 7
    "nonstream": [50, 3],  # non-stream: every DEFAULT_FORCE_STREAM_INTERVAL (50) tokens and at the finish
    "chunked": [1, 1, 1],  # first chunk: nothing; last chunk gives token 1; then decode
    "eos": [3],  # non-stream, stops on EOS at its 3rd token
    "aborted": [1, 1, 1],  # stream, aborted by the real abort_request after 2 tokens: the 3rd step finishes it
    "onetoken": [1],  # max_new_tokens=1: finishes in prefill
    "nologprob": [1, 1, 1, 1],  # return_logprob=False in a logprob batch: empty entropy and logprob slices
}
EXPECTED_FINISH = {
    "stream1": "length",
    "stream3": "length",
    "nonstream": "length",
    "chunked": "length",
    "eos": "stop",
    "aborted": "abort",
    "onetoken": "length",
    "nologprob": "length",
}


def run_scenario(scheduler: Scheduler) -> Scenario:
    """Drive eight requests (stream / non-stream / chunked / EOS / abort / ...) to completion through the real code."""
    assert mixin_mod.DEFAULT_FORCE_STREAM_INTERVAL == 50
    assert scheduler.stream_interval == 1  # sglang's default, which EXPECTED_SEND_SIZES assumes
    reqs = [
        make_req("stream1", 4, stream=True),
        make_req("stream3", 7, stream=True, stream_interval=3),
        make_req("nonstream", 53, stream=False),
        make_req("chunked", 3, stream=True, prompt_len=12),
        make_req("eos", 10, stream=False, eos=EOS),
        make_req("aborted", 10, stream=True),
        make_req("onetoken", 1, stream=True),
        make_req("nologprob", 4, stream=True, return_logprob=False),
    ]
    by_rid = {req.rid: req for req in reqs}
    run = SchedulerRun(scheduler, reqs)
    store = scheduler_store(scheduler)

    by_rid["chunked"].is_chunked = 1  # its prompt does not fit in this prefill: first chunk only
    running = run.prefill(reqs)
    store_after_first_prefill = {rid: rid in store for rid in by_rid}
    running = run.decode(running)
    running += run.prefill([by_rid["chunked"]])  # last chunk: its first token
    while running:
        assert run.steps < 80, "scenario does not terminate"
        aborted = by_rid["aborted"]
        if len(aborted.output_ids) == 2 and not aborted.finished() and aborted.to_finish is None:
            scheduler.running_batch = ScheduleBatch(reqs=list(running))
            scheduler.abort_request(AbortReq(rid="aborted"))
            assert aborted.to_finish is not None  # the real abort of a running request: finish at next step
        running = run.decode(running)
    return Scenario(by_rid, list(sent_to_detokenizer(scheduler)), scheduler, store_after_first_prefill)
