# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's ``AsyncLLMServerManager`` naming every turn's request after its trajectory's session.

verl's manager sends a fresh ``uuid4().hex`` per turn (``agent_loop.py:158``), so nobody can abort a trajectory's
requests. Here the request id of each turn is ``<session prefix><hex>`` (:mod:`treetune_verl.rollout.session`), the
session being the one of the calling trajectory (:data:`~treetune_verl.agent_loop.trajectory.CURRENT_TRAJECTORY`),
and the servers can be told to abort sessions. Used by every agent loop of the worker, stock verl loops included.

:data:`~treetune_verl.agent_loop.trajectory.PROMPT_HOOK`: a callable a worker feature sets for one row's agent loop, called with the prompt ids of each of
that row's turns before the turn is sent (the live forecast starts E's requests for the row's prompt at its first).
"""

from __future__ import annotations

# ruff: noqa: E402  (verl 0.7.1 only: the guard runs before verl's imports, which fail on verl 0.9.1)
from treetune_verl.verl_guard import VERL

VERL.require("session server manager (verl 0.9.1's: resuming_client.py)")

import asyncio
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AsyncLLMServerManager
from verl.utils.rollout_trace import rollout_trace_op

from treetune_verl.agent_loop.trajectory import CURRENT_TRAJECTORY, PROMPT_HOOK
from treetune_verl.rollout.session import EVAL_SESSION, eval_request_id, turn_request_id
from treetune_verl.rollout.token_output import ABORTED_STOP_REASON, empty_token_output


class SessionServerManager(AsyncLLMServerManager):
    """``AsyncLLMServerManager`` whose request ids carry the trajectory's session prefix; aborts by session.

    Outside a trajectory (no :data:`CURRENT_TRAJECTORY`) a request gets verl's plain ``uuid4().hex``. Once the
    trajectory's over-sampled step has reached its target, a turn is answered at once with an empty ``"abort"``
    output, without reaching a server.
    """

    @rollout_trace_op
    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
    ) -> Any:
        """verl's ``generate`` (``agent_loop.py:136-166``) with the session-prefixed request id.

        ``request_id`` stays what verl uses it for: the sticky-session key of the load balancer.
        """
        hook = PROMPT_HOOK.get()
        if hook is not None:
            hook(prompt_ids)
        trajectory = CURRENT_TRAJECTORY.get()
        if trajectory is not None and trajectory.step is not None and trajectory.step.target_reached:
            return empty_token_output(bool(sampling_params.get("logprobs", False)), ABORTED_STOP_REASON)
        turn_id = turn_request_id(trajectory.session) if trajectory is not None else _untracked_request_id()
        server_id, server = await self._acquire_server(request_id)
        try:
            return await server.generate.remote(
                request_id=turn_id,
                prompt_ids=prompt_ids,
                sampling_params=sampling_params,
                image_data=image_data,
                video_data=video_data,
            )
        finally:
            self._release_server(server_id)

    async def abort_sessions(self, sessions: list[str]) -> None:
        """Abort these sessions on every server (a session's turns may have gone to any of them)."""
        await asyncio.gather(*[server.abort_sessions.remote(sessions) for server in self._servers()])

    async def forget_sessions(self, sessions: list[str]) -> None:
        await asyncio.gather(*[server.forget_sessions.remote(sessions) for server in self._servers()])

    def _servers(self) -> list[Any]:
        return list(self._server_id_to_handle.values())


def _untracked_request_id() -> str:
    """The id of a request outside any trajectory: the forecast's E of a group (cut by that group's abort,
    ``session.EVAL_SESSION``), else a fresh one."""
    eval_session = EVAL_SESSION.get()
    return eval_request_id(eval_session) if eval_session is not None else uuid4().hex
