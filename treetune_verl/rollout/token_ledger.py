# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What a server generated for training sessions: tokens since the last reading, and tokens per session.

With carry-over on verl 0.9.1 a step's carried groups are still running when the replay buffer returns; their partial
tokens come back only when the trainer pauses the servers. The tokens a step generated and those it carries into the
next are therefore counted where they are made: each server adds every returned training request's tokens here
(``rollout/server.py``; a cut turn's partial tokens included, and a sync step's requests never span a weight
update: the trainer pauses them first), and the trainer reads it after the pause (``verl/v0_9_1/trainer_seams.py``).
Only the turns of session-named requests count (training rows under over-sampling: ``rollout/session.py``); the
forecast's E (named after its group's session so that the group's abort cuts it, ``session.eval_request_id``) is left
out by the server, and validation sends none. A leaf of the rollout layer: imports nothing of the package.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


class TokenLedger:
    """Tokens of training sessions: the total since :meth:`take_generated` and each session's, until forgotten."""

    def __init__(self) -> None:
        self._generated = 0
        self._by_session: Counter[str] = Counter()

    def add(self, session: str, tokens: int) -> None:
        if tokens < 0:
            raise ValueError(f"session {session}: {tokens} tokens")
        self._generated += tokens
        self._by_session[session] += tokens

    def take_generated(self) -> int:
        """The tokens generated since the last call (a step's, read after the trainer's pause)."""
        generated, self._generated = self._generated, 0
        return generated

    def session_tokens(self, sessions: Iterable[str], forget: bool = False) -> int:
        """Every token generated so far for these sessions, summed; ``forget``: drop them (their groups resolved)."""
        total = 0
        for session in sessions:
            total += self._by_session.pop(session, 0) if forget else self._by_session.get(session, 0)
        return total

    def sessions(self) -> int:
        """How many sessions are remembered (the groups not resolved yet)."""
        return len(self._by_session)
