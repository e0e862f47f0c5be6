# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Scoped abort on a real sglang CPU Engine behind ``EntropySGLangHttpServer`` (verl 0.7.1's server, launched here).

``abort_sessions`` must cut exactly the trajectories named, wherever their requests are: a running request returns
its partial tokens (log-probs and entropy aligned), a queued one returns no token, both with stop reason ``"abort"``;
a request of another caller that is queued behind them, and later requests of other sessions, run normally; a later
turn of an aborted session is answered at once until ``forget_sessions``; afterwards the scheduler holds no entropy
state and the server no session. ``max_running_requests=1`` makes the queue deterministic: one running request, the
rest waiting.
"""

from __future__ import annotations

import asyncio
import time
from uuid import uuid4

import pytest

from treetune_tests.treetune_verl.rollout.server_helpers import make_server, server_config, stop_server
from treetune_verl.rollout.session import eval_request_id, new_session_id, turn_request_id
from treetune_verl.sglang.config import INTERNAL_STATE_KEY

pytest.importorskip("uvicorn", reason="sglang's http_server (imported by verl's server) needs uvicorn")
pytest.importorskip("multipart", reason="sglang's http_server needs python-multipart")

PROMPT_LENGTH, RESPONSE_LENGTH = 32, 900  # the tiny model's context is 1024 tokens
LONG = {"logprobs": True, "temperature": 1.0, "ignore_eos": True}  # runs to max_new_tokens
PROMPT = [5, 6, 7, 8]


def _server(model_path):
    config = server_config(model_path, PROMPT_LENGTH, RESPONSE_LENGTH, engine={"max_running_requests": 1})
    return make_server(config)


async def _entropy_requests(server) -> int:
    """The scheduler's count of requests holding entropy state (what sglang's ``/server_info`` reports; the HTTP
    endpoint would block this event loop, which also runs the server)."""
    (state,) = await server.tokenizer_manager.get_internal_state()
    return state[INTERNAL_STATE_KEY]


async def _entropy_requests_at_least(server, count: int) -> bool:
    return await _entropy_requests(server) >= count


async def _sent_to_scheduler(server, rids: list[str]) -> bool:
    """Whether sglang's tokenizer manager has sent every one of these requests to the scheduler (it records a
    request's state right after sending it; an abort sent later reaches the scheduler after it)."""
    return all(rid in server.tokenizer_manager.rid_to_state for rid in rids)


async def _until(condition, what: str, timeout_s: float = 60.0) -> None:
    """Poll the async ``condition`` every 5 ms; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.005)


def _well_formed(output) -> None:
    assert len(output.token_ids) == len(output.log_probs) == len(output.entropy)


@pytest.mark.engine
async def test_abort_sessions_cuts_exactly_the_named_trajectories(tiny_model_dir, isolated_env):
    server = _server(tiny_model_dir)
    running, queued, untouched = new_session_id(), new_session_id(), new_session_id()
    try:
        await server.launch_server()
        # warm-up, and a turn of `running`'s session that finishes before the abort: it stays finished
        first = await server.generate(PROMPT, {**LONG, "max_new_tokens": 4}, turn_request_id(running))
        assert len(first.token_ids) == 4 and first.stop_reason == "length"
        t0 = time.monotonic()
        full = await server.generate(PROMPT, dict(LONG), uuid4().hex)
        full_s = time.monotonic() - t0  # one long request alone; the waits below are fractions of it
        assert len(full.token_ids) == RESPONSE_LENGTH

        # Each step waits for the state it needs instead of a share of `full_s`: on a shared CI machine one timing
        # of the long request can be several times another (a fixed share let `a` finish before the abort).
        a = asyncio.create_task(server.generate(PROMPT, dict(LONG), turn_request_id(running)))
        await _until(lambda: _entropy_requests_at_least(server, 1), "the first request admitted")
        await asyncio.sleep(20 * full_s / RESPONSE_LENGTH)  # `a` decodes ~20 tokens (of 900)
        rids = [turn_request_id(queued), uuid4().hex, turn_request_id(untouched)]
        b = asyncio.create_task(server.generate(PROMPT, dict(LONG), rids[0]))
        other = asyncio.create_task(server.generate(PROMPT, {**LONG, "max_new_tokens": 8}, rids[1]))
        later = asyncio.create_task(server.generate(PROMPT, {**LONG, "max_new_tokens": 8}, rids[2]))
        await _until(lambda: _sent_to_scheduler(server, rids), "the three requests queued at the scheduler")
        assert not a.done() and not b.done(), "the running request ended before the abort: the setup is wrong"
        t0 = time.monotonic()
        # the queued session first: its AbortReq reaches the scheduler before the running one frees the slot (one
        # message per session, so in the other order the scheduler may admit `b` in between; see abort_sessions)
        await server.abort_sessions([queued, running])
        a_out, b_out = await asyncio.wait_for(asyncio.gather(a, b), timeout=30)
        abort_latency = time.monotonic() - t0
        other_out, later_out = await asyncio.wait_for(asyncio.gather(other, later), timeout=60)

        # a later turn of an aborted session is answered at once, without reaching sglang
        t0 = time.monotonic()
        again = await server.generate(PROMPT, dict(LONG), turn_request_id(running))
        again_s = time.monotonic() - t0
        assert await server.aborted_session_count() == 2
        await server.forget_sessions([running, queued])
        assert await server.aborted_session_count() == 0
        after = await server.generate(PROMPT, {**LONG, "max_new_tokens": 6}, turn_request_id(running))
        entropy_requests = await _entropy_requests(server)
    finally:
        await stop_server(server)

    print(
        f"long request alone {full_s:.2f}s; running abort: {len(a_out.token_ids)} partial tokens; queued abort: {len(b_out.token_ids)} tokens; "
        f"abort latency {abort_latency:.2f}s; aborted session's later turn {again_s * 1e3:.1f} ms"
    )
    # running: partial tokens, aligned; queued: none
    assert a_out.stop_reason == "abort" and 0 < len(a_out.token_ids) < RESPONSE_LENGTH
    _well_formed(a_out)
    assert b_out.stop_reason == "abort" and b_out.token_ids == [] and b_out.log_probs == [] and b_out.entropy == []
    # another caller's request and another session, queued behind the aborted ones, ran to their end
    for out in (other_out, later_out):
        assert out.stop_reason == "length" and len(out.token_ids) == 8
        _well_formed(out)
    assert again.stop_reason == "abort" and again.token_ids == [] and again_s < 0.1
    assert after.stop_reason == "length" and len(after.token_ids) == 6  # forgotten: generates normally
    _well_formed(after)
    # marked as cut by their session (carry-over's resuming client does not re-send those), and only those
    assert a_out.session_aborted and b_out.session_aborted and again.session_aborted
    assert not any(out.session_aborted for out in (other_out, later_out, after, first, full))
    assert entropy_requests == 0  # no entropy state of an aborted request left in the scheduler


@pytest.mark.engine
async def test_the_forecasts_e_is_cut_by_its_groups_abort_and_is_no_turn_of_the_ledger(tiny_model_dir, isolated_env):
    """A request of the forecast's E named after a group's session (``session.eval_request_id``) is cut by that
    session's abort like the group's turns, and the token ledger (carry-over) counts the turns' tokens only."""
    server = _server(tiny_model_dir)
    group = new_session_id()
    try:
        await server.launch_server()
        await server.enable_token_ledger()
        turn = await server.generate(PROMPT, {**LONG, "max_new_tokens": 4}, turn_request_id(group))
        e = asyncio.create_task(server.generate(PROMPT, dict(LONG), eval_request_id(group)))
        await _until(lambda: _entropy_requests_at_least(server, 1), "E's request admitted")
        await asyncio.sleep(0.3)  # E decodes (the tiny model: ~100 of its 900 tokens), so the ledger would see them
        await server.abort_sessions([group])
        e_out = await asyncio.wait_for(e, timeout=30)
        generated = await server.generated_tokens()
        in_session = await server.session_tokens([group], forget=True)
        await server.forget_sessions([group])
    finally:
        await stop_server(server)

    assert e_out.stop_reason == "abort" and e_out.session_aborted and 0 < len(e_out.token_ids) < RESPONSE_LENGTH
    _well_formed(e_out)
    assert len(turn.token_ids) == 4 and generated == in_session == 4  # E's tokens are not the group's


async def test_abort_sessions_refuses_a_request_id(tiny_model_dir, isolated_env):
    server = _server(tiny_model_dir)
    with pytest.raises(ValueError, match="not a session prefix"):
        await server.abort_sessions([turn_request_id(new_session_id())])
    with pytest.raises(ValueError, match="not a session prefix"):
        await server.abort_sessions([uuid4().hex])


@pytest.mark.engine
async def test_pause_returns_once_the_running_requests_have_ended(tiny_model_dir, isolated_env):
    """verl's pause (``abort_all_requests``, carry-over on verl 0.9.1 calls it at every step) with a request decoding:
    sglang's own pause is entered with no request running, so it returns at its first check instead of polling a
    second later (without our override it is entered at once, a request running); the request comes back
    ``"abort"`` with its partial tokens, not marked ``session_aborted``; a request sent while paused waits and runs
    after ``resume_generation``."""
    server = _server(tiny_model_dir)
    running_at_sglang_pause = []
    try:
        await server.launch_server()
        await server.generate(PROMPT, {**LONG, "max_new_tokens": 4}, uuid4().hex)  # warm-up
        manager = server.tokenizer_manager
        sglang_pause = manager.pause_generation

        async def pause_generation(obj):  # on the real TokenizerManager instance: what sglang's pause finds
            running_at_sglang_pause.append(await manager.model_update_lock.is_locked())
            return await sglang_pause(obj)

        manager.pause_generation = pause_generation
        running = asyncio.create_task(server.generate(PROMPT, dict(LONG), turn_request_id(new_session_id())))
        while not await manager.model_update_lock.is_locked():  # admitted
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # decoding
        t0 = time.monotonic()
        await server.abort_all_requests()
        pause_s = time.monotonic() - t0
        out = await asyncio.wait_for(running, timeout=30)
        held = asyncio.create_task(server.generate(PROMPT, {**LONG, "max_new_tokens": 5}, uuid4().hex))
        await asyncio.sleep(0.3)
        held_while_paused = not held.done()
        await server.resume_generation()
        held_out = await asyncio.wait_for(held, timeout=60)
    finally:
        await stop_server(server)

    print(f"pause with a request decoding: {pause_s * 1e3:.0f} ms; cut at {len(out.token_ids)} tokens")
    assert running_at_sglang_pause == [False]
    assert out.stop_reason == "abort" and 0 < len(out.token_ids) < RESPONSE_LENGTH and not out.session_aborted
    _well_formed(out)
    assert held_while_paused and held_out.stop_reason == "length" and len(held_out.token_ids) == 5
