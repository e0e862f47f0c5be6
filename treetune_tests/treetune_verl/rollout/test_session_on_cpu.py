# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Session ids: a session prefix matches, by sglang's prefix rule, exactly the request ids of its own turns."""

from __future__ import annotations

from uuid import uuid4

import pytest

from treetune_verl.rollout.session import (
    eval_request_id,
    group_session_id,
    is_eval_request,
    is_session_id,
    new_session_id,
    session_of,
    turn_request_id,
)


def _scheduler_matches(abort_rid: str, rid: str) -> bool:
    """sglang 0.5.6.post2's scheduler rule for an ``AbortReq`` (``scheduler.py`` ``abort_request``)."""
    return rid.startswith(abort_rid)


def test_a_session_prefix_matches_its_own_turns_only():
    sessions = [new_session_id() for _ in range(200)]
    turns = {s: [turn_request_id(s) for _ in range(3)] for s in sessions}
    # sglang's n > 1 copies of a request are "{rid}_{i}"; other callers use uuid4().hex
    others = [uuid4().hex for _ in range(50)]
    for session in sessions:
        assert is_session_id(session) and session.endswith(":")
        for other, rids in turns.items():
            for rid in rids:
                assert session_of(rid) == other
                for candidate in (rid, f"{rid}_0", f"{rid}_10"):
                    assert _scheduler_matches(session, candidate) == (other == session)
        assert not any(_scheduler_matches(session, rid) for rid in others)


def test_without_the_delimiter_one_id_would_abort_another():
    """Why the delimiter: sglang matches by prefix, and ``X_1`` is a prefix of ``X_10``."""
    assert _scheduler_matches("X_1", "X_10") and not _scheduler_matches("X_1:", "X_10:ab")


def test_session_of_and_refusals():
    assert session_of(uuid4().hex) is None and session_of("tts-abc") is None
    with pytest.raises(ValueError, match="not a session id"):
        turn_request_id(uuid4().hex)
    with pytest.raises(ValueError, match="not a session id"):
        turn_request_id(turn_request_id(new_session_id()))


def test_a_group_session_is_the_same_in_every_process_and_matches_its_group_only():
    """The trainer aborts a group knowing only its uid: the workers name its turns by the same prefix."""
    uids = [str(uuid4()) for _ in range(200)] + ["0", "00", "pad1"]
    sessions = [group_session_id(uid) for uid in uids]
    assert sessions == [group_session_id(uid) for uid in uids] and len(set(sessions)) == len(uids)
    for session in sessions:
        assert is_session_id(session)
        turn = turn_request_id(session)
        assert session_of(turn) == session
        assert [_scheduler_matches(other, turn) for other in sessions].count(True) == 1


def test_es_requests_ride_with_a_session_and_are_told_apart_from_its_turns():
    """The forecast's E of a group is cut by the group's abort (the scheduler's prefix rule) but is none of its turns
    (the token ledger counts turns only)."""
    session, other = group_session_id("u"), group_session_id("v")
    evals = [eval_request_id(session) for _ in range(100)]
    turns = [turn_request_id(session) for _ in range(1000)]
    assert len(set(evals)) == 100
    for rid in evals:
        assert session_of(rid) == session and is_eval_request(rid)
        assert _scheduler_matches(session, rid) and not _scheduler_matches(other, rid)
    assert not any(is_eval_request(rid) for rid in turns)  # a turn's id is hex after the prefix: never "eval-"
    assert not is_eval_request(uuid4().hex) and not is_eval_request("eval-" + uuid4().hex)
    with pytest.raises(ValueError, match="not a session id"):
        eval_request_id("u")
