# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Session ids: one per trajectory, the prefix of the request id of every turn it sends, so it can be aborted alone.

sglang's scheduler aborts every request whose rid *starts with* an ``AbortReq``'s rid (``scheduler.py``
``abort_request``), while its TokenizerManager matches rids exactly; and ``X_1`` is a prefix of ``X_10``. A session
prefix therefore ends with :data:`SESSION_DELIMITER`, a character no generated id contains (``uuid4().hex`` is
``[0-9a-f]``, and sglang's ``n > 1`` copies append ``_<i>`` after the whole rid), so a prefix matches exactly the
turns of its own trajectory and nothing of another caller or a later step.

    session = new_session_id()          # "tts-3f2a...9c:"
    rid = turn_request_id(session)      # "tts-3f2a...9c:71be...04"
    session_of(rid) == session

A group's rows may share one session (:func:`group_session_id`, derived from the group's ``uid``), so that whoever
knows the uid can abort all of the group's turns with one prefix, without asking the workers for their sessions.

A request that rides along with a session without being one of its turns (the live forecast's E, sampled for the
group's prompt) gets :func:`eval_request_id`: the session prefix, then :data:`EVAL_TAG` (not hex, so no turn id
starts with it), then a fresh hex id. The session's abort cuts it as it cuts the turns; :func:`is_eval_request` tells
it apart (the servers' token ledger counts turns only).
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from uuid import uuid4

SESSION_DELIMITER = ":"
_SESSION_TAG = "tts-"
EVAL_TAG = "eval-"  # after a session prefix: a request of the forecast's E, not a turn

# Set in the task of the live forecast's E for one group (``forecast/rollout_eval.py`` ``start_sampling``): the session
# whose abort also cuts E's requests. Whoever names requests gives E's :func:`eval_request_id` of it (verl 0.9.1:
# ``verl/v0_9_1/over_sample_worker.py`` SessionLLMServerClient, verl 0.7.1: ``session_server_manager.py``).
EVAL_SESSION: ContextVar[str | None] = ContextVar("treetune_eval_session", default=None)


def new_session_id() -> str:
    """A fresh session prefix: ``"tts-<32 hex>:"``."""
    return f"{_SESSION_TAG}{uuid4().hex}{SESSION_DELIMITER}"


def group_session_id(group: str) -> str:
    """The session prefix of every row of ``group`` (a uid): ``"tts-<32 hex>:"``, the same in every process."""
    return f"{_SESSION_TAG}{hashlib.blake2b(group.encode(), digest_size=16).hexdigest()}{SESSION_DELIMITER}"


def turn_request_id(session: str) -> str:
    """The request id of one turn of ``session``: the session prefix followed by a fresh hex id."""
    return f"{_checked(session)}{uuid4().hex}"


def eval_request_id(session: str) -> str:
    """The request id of a request of the forecast's E that ``session``'s abort also cuts (module docstring)."""
    return f"{_checked(session)}{EVAL_TAG}{uuid4().hex}"


def is_eval_request(request_id: str) -> bool:
    """Whether ``request_id`` was made by :func:`eval_request_id`."""
    session = session_of(request_id)
    return session is not None and request_id.startswith(EVAL_TAG, len(session))


def _checked(session: str) -> str:
    if not is_session_id(session):
        raise ValueError(f"not a session id: {session!r} (expected {_SESSION_TAG}<hex>{SESSION_DELIMITER})")
    return session


def is_session_id(session: str) -> bool:
    return session.startswith(_SESSION_TAG) and session.count(SESSION_DELIMITER) == 1 and session.endswith(":")


def session_of(request_id: str) -> str | None:
    """The session prefix a request id belongs to, or ``None`` for an id not made by :func:`turn_request_id`."""
    if not request_id.startswith(_SESSION_TAG) or SESSION_DELIMITER not in request_id:
        return None
    return request_id[: request_id.index(SESSION_DELIMITER) + 1]
