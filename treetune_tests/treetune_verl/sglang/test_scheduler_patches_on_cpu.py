# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``scheduler_patches``: a real, fully built sglang 0.5.6.post2 ``Scheduler`` records, sends and frees entropy.

Each test builds a real ``Scheduler(server_args, port_args, gpu_id=0, tp_rank=0, moe_ep_rank=0, pp_rank=0,
dp_rank=None)`` on the tiny model with the CPU Engine settings, in this process, after the patches are applied (as
``custom_run_scheduler_process`` does), so its own ``init_sockets`` builds and wraps the real ``SenderWrapper``s.
The real (patched) ``process_batch_result_prefill`` / ``process_batch_result_decode``, ``stream_output_generation``,
``abort_request`` and ``get_internal_state`` then run over many steps on real ``Req`` / ``ScheduleBatch`` /
``GenerationBatchResult`` objects (``scheduler_scenario.py``).

Reference: the entropy fed for token ``t`` of request ``k`` is a known unique number (``token_value``), so each
sent slice must equal exactly the values of the tokens in that send, aligned with their logprobs. Stand-ins left:
the zmq socket inside each ``SenderWrapper`` (captures what is sent) and, for the synthetic-result scenarios, the
radix cache (their requests never had KV slots; see ``sglang_objects``). The real model forward through the same
patches is checked in ``test_output_pipeline_on_cpu``.
"""

from __future__ import annotations

from sglang.srt.layers import sampler as sampler_mod
from sglang.srt.managers.io_struct import AbortReq, GetInternalStateReq
from sglang.srt.managers.scheduler import Scheduler

from treetune_tests.treetune_verl.sglang.scheduler_scenario import (
    EXPECTED_FINISH,
    EXPECTED_SEND_SIZES,
    SENTINEL,
    Scenario,
    SchedulerRun,
    sends_by_rid,
    sent_to_detokenizer,
    sent_to_tokenizer,
    token_value,
)
from treetune_tests.treetune_verl.sglang.sglang_objects import make_req
from treetune_verl.sglang.patching import is_patched
from treetune_verl.sglang.v0_5_6_post2.scheduler_patches import INTERNAL_STATE_KEY, STORE_ATTR, scheduler_store
from treetune_verl.sglang.v0_5_6_post2.store import EntropyStore


def test_real_scheduler_is_built_with_wrapped_senders_and_the_entropy_sampler(patched, real_scheduler):
    scheduler = real_scheduler()
    assert type(scheduler) is Scheduler
    for sender in (scheduler.send_to_detokenizer, scheduler.send_to_tokenizer):
        assert is_patched(sender, "send_output")  # wrapped by the patched init_sockets, per instance
        assert not is_patched(type(sender), "send_output")  # sglang's SenderWrapper class itself is untouched
    assert isinstance(getattr(scheduler, STORE_ATTR), EntropyStore) and len(scheduler_store(scheduler)) == 0
    # ModelRunner looked the Sampler up by name when it was built: it is the patched one
    assert type(scheduler.tp_worker.model_runner.sampler) is sampler_mod.Sampler
    assert type(scheduler.tp_worker.model_runner.sampler).__name__ == "EntropySampler"


def test_outgoing_entropy_slices_are_exactly_the_new_values(scenario: Scenario):
    sends = sends_by_rid(scenario.outputs)
    assert set(sends) == set(EXPECTED_SEND_SIZES)
    for rid, req in scenario.reqs.items():
        k = list(scenario.reqs).index(rid)
        got = sends[rid]
        assert [len(s.output_ids) for s in got] == EXPECTED_SEND_SIZES[rid], rid
        assert [s.finish is not None for s in got] == [False] * (len(got) - 1) + [True], rid
        assert got[-1].finish["type"] == EXPECTED_FINISH[rid], (rid, got[-1].finish)
        assert sum((s.output_ids for s in got), []) == req.output_ids_through_stop, rid
        if not req.return_logprob:
            assert all(s.entropy == [] and s.logprobs == [] for s in got), rid
            continue
        start = 0
        for s in got:  # each slice: the values of exactly the tokens in this send, aligned with their logprobs
            end = start + len(s.output_ids)
            assert s.entropy == [token_value(k, t) for t in range(start, end)], (rid, start)
            assert s.logprobs == [-token_value(k, t) for t in range(start, end)], (rid, start)
            start = end
        assert start == len(req.output_ids_through_stop) == len(req.output_token_logprobs_val)


def test_rows_without_a_token_record_nothing(scenario: Scenario):
    sent_values = [v for out in scenario.outputs for values in out.output_token_entropy_val for v in values]
    assert SENTINEL not in sent_values and all(v > 0 for v in sent_values)
    # after the first prefill: the chunked request (no token yet) and the no-logprob one hold nothing, the
    # one-token request already finished and was cleaned up when its finished output was sent
    assert scenario.store_after_first_prefill == {
        "stream1": True,
        "stream3": True,
        "nonstream": True,
        "chunked": False,
        "eos": True,
        "aborted": True,
        "onetoken": False,
        "nologprob": False,
    }
    first_rids = scenario.outputs[0].rids
    assert "chunked" not in first_rids and "onetoken" in first_rids


def test_store_is_empty_once_every_request_finished(scenario: Scenario):
    assert all(req.finished() for req in scenario.reqs.values())
    assert len(scheduler_store(scenario.scheduler)) == 0
    assert sorted(scenario.scheduler.tree_cache.finished) == sorted(scenario.reqs)  # each released exactly once


def test_overlap_rows_finished_or_retracted_since_launch_are_skipped(patched, real_scheduler):
    """Under overlap the batch of step t+1 is launched before step t is processed: it still holds a request that
    finished in step t, and one the scheduler retracted meanwhile. Neither row gets a token, so neither gets entropy;
    the retracted request gets its next value from its re-prefill."""
    scheduler = real_scheduler(overlap=True)
    assert scheduler.enable_overlap
    reqs = [make_req("short", 2, stream=True), make_req("long", 4, stream=True), make_req("retracted", 4, stream=True)]
    short, long, retracted = reqs
    run = SchedulerRun(scheduler, reqs)
    store = scheduler_store(scheduler)
    running = run.prefill(reqs)
    running = run.decode(running)  # short finishes here ...
    assert short.finished() and running == reqs  # ... but the batch already launched still holds it
    assert "short" not in store
    retracted.reset_for_retract()  # the real retraction (KV pressure), after that batch was launched
    running = run.decode(running)
    assert "short" not in store and len(short.output_ids) == 2  # skipped by sglang and by the entropy hook
    assert len(retracted.output_ids) == 2 and len(long.output_ids) == 3
    running.remove(retracted)  # back to the waiting queue ...
    retracted.is_retracted = False  # ... and re-prefilled (ScheduleBatch.prepare_for_extend clears the flag)
    running += run.prefill([retracted])
    while running:
        running = run.decode(running)
    assert len(store) == 0
    sends = sends_by_rid(sent_to_detokenizer(scheduler))
    assert sends["short"][-1].entropy == [token_value(0, 1)]
    for k, req in enumerate(reqs):
        got = sends[req.rid]
        # (sglang also streams an empty slice for the retracted row: the entropy slice is empty with it)
        assert all(len(s.entropy) == len(s.logprobs) == len(s.output_ids) for s in got), req.rid
        assert sum((s.entropy for s in got), []) == [token_value(k, t) for t in range(len(req.output_ids))]
        assert sum((s.logprobs for s in got), []) == [-token_value(k, t) for t in range(len(req.output_ids))]


def test_abort_req_through_the_wrapped_sender_cleans_up(patched, real_scheduler):
    """A retracted request waiting for re-prefill holds entropy; the real abort_request sends AbortReq and frees it."""
    scheduler = real_scheduler()
    store = scheduler_store(scheduler)
    waiting = make_req("waiting", 8, stream=True)
    for value in (0.5, 0.75):
        store.append("waiting", value)
    store.append("other", 1.5)
    scheduler.waiting_queue.append(waiting)

    scheduler.abort_request(AbortReq(rid="waiting"))

    assert scheduler.waiting_queue == []
    assert [type(o) for o in sent_to_tokenizer(scheduler)] == [AbortReq]
    assert sent_to_tokenizer(scheduler)[0].rid == "waiting"  # still delivered by the real SenderWrapper
    assert "waiting" not in store and store.get_since_offset("other") == [1.5]
    # the detokenizer-side sender is wrapped the same way
    scheduler.send_to_detokenizer.send_output(AbortReq(rid="other"))
    assert len(store) == 0 and isinstance(sent_to_detokenizer(scheduler)[-1], AbortReq)


def test_internal_state_reports_held_requests(patched, real_scheduler):
    scheduler = real_scheduler()
    store = scheduler_store(scheduler)
    assert scheduler.get_internal_state(GetInternalStateReq()).internal_state[INTERNAL_STATE_KEY] == 0
    store.append("a", 1.0)
    store.append("b", 2.0)
    state = scheduler.get_internal_state(GetInternalStateReq()).internal_state
    assert state[INTERNAL_STATE_KEY] == 2
    assert state["memory_usage"]["token_capacity"] == scheduler.max_total_num_tokens  # upstream's keys are kept
    store.cleanup("a")
    store.cleanup("b")
    assert scheduler.get_internal_state(GetInternalStateReq()).internal_state[INTERNAL_STATE_KEY] == 0
