# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``tokenizer_patches``: a real sglang 0.5.6.post2 ``TokenizerManager`` turns entropy chunks into ``meta_info``.

The manager is built by its own ``__init__`` on the tiny model (``tokenizer_manager`` fixture); its real (patched)
``convert_logprob_style``, ``add_logprob_to_meta_info``, ``_handle_batch_output`` and ``_handle_abort_req`` run on
real ``ReqState``s and ``BatchStrOutput``s. Reference: the entropy values put into the chunks by hand, which must
come out accumulated per request, aligned index for index with ``output_token_logprobs``, each ``meta_info`` holding
its own copy; requests without tokens get ``[]``; an unpatched scheduler is reported once.
"""

from __future__ import annotations

import logging

from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager

from treetune_tests.treetune_verl.sglang.sglang_objects import make_state, str_chunk
from treetune_verl.sglang import tokenizer_patches
from treetune_verl.sglang.tokenizer_patches import META_INFO_ENTROPY_KEY, REQ_STATE_ENTROPY_ATTR, REQ_STATE_REFUSED_ATTR


def convert(manager: TokenizerManager, state: ReqState, chunk, index: int) -> dict:
    """Call the patched ``convert_logprob_style`` the way ``_handle_batch_output`` does; returns the meta_info."""
    meta_info: dict = {}
    manager.convert_logprob_style(meta_info, state, 0, None, False, chunk, index)
    return meta_info


def test_convert_logprob_style_accumulates_entropy_copies(patched, tokenizer_manager):
    a, b = make_state("a", stream=True), make_state("b", stream=True)
    chunks = [
        str_chunk({"a": ([11], [-0.5], [1.25], None), "b": ([21, 22], [-0.1, -0.2], [0.5, 0.75], None)}),
        str_chunk({"b": ([23], [-0.3], [2.0], None), "a": ([12, 13], [-0.6, -0.7], [1.5, 1.75], None)}),
        str_chunk({"a": ([14], [-0.8], [3.0], {"type": "length", "length": 4})}),
    ]
    manager = tokenizer_manager
    metas_a = [convert(manager, a, chunks[0], 0), convert(manager, a, chunks[1], 1), convert(manager, a, chunks[2], 0)]
    metas_b = [convert(manager, b, chunks[0], 1), convert(manager, b, chunks[1], 0)]

    key = META_INFO_ENTROPY_KEY
    assert [m[key] for m in metas_a] == [[1.25], [1.25, 1.5, 1.75], [1.25, 1.5, 1.75, 3.0]]
    assert [m[key] for m in metas_b] == [[0.5, 0.75], [0.5, 0.75, 2.0]]
    for meta in metas_a + metas_b:  # aligned index for index with the logprobs sglang reports
        assert len(meta[key]) == len(meta["output_token_logprobs"])
    assert [t for _, t, _ in metas_a[-1]["output_token_logprobs"]] == [11, 12, 13, 14]
    # each meta_info holds its own list: later chunks did not grow the earlier ones
    assert metas_a[0][key] is not metas_a[1][key]
    assert metas_a[0][key] is not getattr(a, REQ_STATE_ENTROPY_ATTR)


def test_convert_skips_batches_without_logprobs(patched, tokenizer_manager):
    state = make_state("a")
    chunk = str_chunk({"a": ([11], [-0.5], [1.25], None)})
    chunk.input_token_logprobs_val = None  # no request of the scheduler batch wanted logprobs
    assert convert(tokenizer_manager, state, chunk, 0) == {}
    assert getattr(state, REQ_STATE_ENTROPY_ATTR, None) is None


def test_request_without_tokens_gets_empty_entropy(patched, tokenizer_manager):
    """Aborted while waiting: ``add_logprob_to_meta_info`` runs directly on a state that never got a chunk."""
    meta_info: dict = {}
    tokenizer_manager.add_logprob_to_meta_info(meta_info, make_state("w"), 0, None, False)
    assert meta_info[META_INFO_ENTROPY_KEY] == [] and meta_info["output_token_logprobs"] == []

    # the same through sglang's own abort handler
    state = make_state("w2", stream=True)
    tokenizer_manager.rid_to_state["w2"] = state
    tokenizer_manager._handle_abort_req(AbortReq(rid="w2"))
    (out,) = state.out_list
    assert out["meta_info"][META_INFO_ENTROPY_KEY] == [] and out["meta_info"]["finish_reason"]["type"] == "abort"


def test_aborted_after_tokens_keeps_what_was_received(patched, tokenizer_manager):
    state = make_state("r", stream=True)
    tokenizer_manager.rid_to_state["r"] = state
    tokenizer_manager._handle_batch_output(str_chunk({"r": ([11, 12], [-0.5, -0.6], [1.0, 2.0], None)}))
    tokenizer_manager._handle_abort_req(AbortReq(rid="r"))
    meta = state.out_list[-1]["meta_info"]
    assert meta[META_INFO_ENTROPY_KEY] == [1.0, 2.0] and len(meta["output_token_logprobs"]) == 2


def test_outputs_without_entropy_are_reported_once(patched, tokenizer_manager, caplog, monkeypatch):
    """A scheduler started without the patches sends no entropy: logged once, and no made-up values."""
    monkeypatch.setattr(tokenizer_patches, "_warned_unpatched_scheduler", False)
    state = make_state("u", stream=True)
    metas = []
    with caplog.at_level(logging.ERROR, logger=tokenizer_patches.__name__):
        for ids in ([11], [12, 13]):
            chunk = str_chunk({"u": (ids, [-0.5] * len(ids), [], None)})
            chunk.output_token_entropy_val = None  # what an unpatched scheduler sends
            metas.append(convert(tokenizer_manager, state, chunk, 0))
    (record,) = caplog.records  # two chunks, one message
    assert "runs without our patches" in record.getMessage()
    assert all(META_INFO_ENTROPY_KEY not in meta for meta in metas)
    assert len(metas[-1]["output_token_logprobs"]) == 3


def test_a_refused_chunk_leaves_the_request_without_entropy_from_then_on(patched, tokenizer_manager, caplog):
    """A version adapter refused one output (``None`` for the row, 0.5.12's misaligned ``customized_info``): the
    request gets no entropy in that chunk or any later one, not a list missing that chunk's tokens, and nothing is
    blamed on an unpatched scheduler."""
    state = make_state("x", stream=True)
    first = str_chunk({"x": ([11], [-0.5], [1.0], None)})
    refused = str_chunk({"x": ([12], [-0.6], [2.0], None)})
    refused.output_token_entropy_val = [None]
    last = str_chunk({"x": ([13], [-0.7], [3.0], None)})
    with caplog.at_level(logging.ERROR, logger=tokenizer_patches.__name__):
        metas = [convert(tokenizer_manager, state, chunk, 0) for chunk in (first, refused, last)]
    assert metas[0][META_INFO_ENTROPY_KEY] == [1.0]
    assert all(META_INFO_ENTROPY_KEY not in meta for meta in metas[1:]) and getattr(state, REQ_STATE_REFUSED_ATTR)
    assert len(metas[-1]["output_token_logprobs"]) == 3 and not caplog.records


def test_values_not_lined_up_with_the_logprobs_are_withheld(patched, tokenizer_manager, caplog):
    """The last guard: a request whose entropy count differs from its logprob count gets no entropy (logged, naming
    the request), never a list that would shift values onto other tokens."""
    state = make_state("y", stream=True)
    chunk = str_chunk({"y": ([11, 12], [-0.5, -0.6], [1.0], None)})  # one value for two tokens
    with caplog.at_level(logging.ERROR, logger=tokenizer_patches.__name__):
        meta = convert(tokenizer_manager, state, chunk, 0)
        later = convert(tokenizer_manager, state, str_chunk({"y": ([13], [-0.7], [3.0], None)}), 0)
    assert META_INFO_ENTROPY_KEY not in meta and META_INFO_ENTROPY_KEY not in later
    (record,) = caplog.records
    assert "request y has 1 entropy values for 2 output logprobs" in record.getMessage()
