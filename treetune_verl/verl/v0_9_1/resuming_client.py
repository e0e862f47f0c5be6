# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1 carry-over: verl's resuming client, keeping the entropy and weight version of every attempt.

With carry-over the trainer pauses every server at the end of a step's sampling (the requests still running come
back ``"abort"`` with their partial tokens), updates the weights, and resumes the servers; verl's
``FullyAsyncLLMServerClient`` (``verl/workers/rollout/llm_server.py``) makes that invisible to the agent loop: on an
``"abort"`` it re-sends the prompt and the tokens so far with the budget left, and concatenates the attempts' tokens
and log-probs (each token's own behaviour log-prob). Its loop rebuilds verl's plain ``TokenOutput``, which drops our
per-token entropy; :class:`ResumingLLMServerClient` puts the two back:

- a tap below verl's loop (:class:`_AttemptTap`, where the loop calls ``super().generate``) keeps every attempt's
  output; the whole call's :class:`EntropyTokenOutput` gets the attempts' entropy concatenated, and in
  ``extra_fields["token_global_steps"]`` the weight version of each token (the server's ``global_steps`` when its
  attempt ran);
- a group the trainer *drops* (too stale, or failed) is aborted by session (the server marks those outputs
  ``session_aborted``): the tap hands verl's loop another stop reason so that it does not retry, and the whole call
  ends ``"abort"`` with what was generated, as without carry-over.

Turns are named by group session as in ``over_sample_worker.py`` (this client is a :class:`SessionLLMServerClient`).
"""

from __future__ import annotations

import contextvars
from typing import Any

from treetune_verl.agent_loop.recorder import served_entropy
from treetune_verl.batch_keys import TOKEN_GLOBAL_STEPS_KEY
from treetune_verl.rollout.token_output import ABORTED_STOP_REASON, EntropyTokenOutput
from treetune_verl.verl.v0_9_1.over_sample_worker import SessionLLMServerClient, session_client
from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("resuming client")  # verl 0.7.1 has no FullyAsyncLLMServerClient: carry_over_worker.py there

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient  # noqa: E402

__all__ = ["DROPPED_STOP_REASON", "ResumingLLMServerClient", "resuming_client"]

# What verl's resume loop sees for an attempt of a dropped group: anything but "abort" / "aborted" ends the loop.
DROPPED_STOP_REASON = "treetune_dropped"

# The attempts of the generate call running in this task (verl's loop awaits them one after the other).
_ATTEMPTS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("treetune_attempts", default=None)


class _AttemptTap(SessionLLMServerClient):
    """One attempt of verl's resume loop: the server's output, kept for the whole call."""

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        output = await super().generate(request_id, **kwargs)
        attempts = _ATTEMPTS.get()
        if attempts is not None:
            attempts.append(output)
        if getattr(output, "session_aborted", False):
            return output.model_copy(update={"stop_reason": DROPPED_STOP_REASON})
        return output


class ResumingLLMServerClient(FullyAsyncLLMServerClient, _AttemptTap):
    """verl's ``FullyAsyncLLMServerClient`` whose output is an :class:`EntropyTokenOutput` over all its attempts.

    ``entropy`` (nats) and ``extra_fields["token_global_steps"]`` are aligned with ``token_ids``; ``stop_reason`` is
    ``"abort"`` when the trainer dropped the group (module docstring).

    Raises:
        RuntimeError: the attempts' tokens do not add up to the output's, or an attempt came without entropy.
    """

    async def generate(self, request_id: str, **kwargs: Any) -> EntropyTokenOutput:
        attempts: list[Any] = []
        token = _ATTEMPTS.set(attempts)
        try:
            output = await super().generate(request_id, **kwargs)
        finally:
            _ATTEMPTS.reset(token)
        if sum(len(attempt.token_ids) for attempt in attempts) != len(output.token_ids):
            raise RuntimeError(
                f"request {request_id}: {len(output.token_ids)} tokens from attempts of "
                f"{[len(attempt.token_ids) for attempt in attempts]}"
            )
        entropy = None  # logprobs not requested: the agent loop's recorder says what to set
        if attempts and all(attempt.log_probs is not None for attempt in attempts):
            entropy = [value for attempt in attempts for value in served_entropy(attempt)]
        steps = [attempt.extra_fields.get("global_steps") for attempt in attempts for _ in attempt.token_ids]
        stop_reason = output.stop_reason
        if attempts and attempts[-1].session_aborted:
            stop_reason = ABORTED_STOP_REASON
        extra_fields = {**output.extra_fields, TOKEN_GLOBAL_STEPS_KEY: steps}
        fields = {**dict(output), "stop_reason": stop_reason, "extra_fields": extra_fields}
        return EntropyTokenOutput(**fields, entropy=entropy)


def resuming_client(client: Any) -> ResumingLLMServerClient:
    """A :class:`ResumingLLMServerClient` built as verl built its plain ``client`` (``session_client``'s checks)."""
    return session_client(client, ResumingLLMServerClient)  # only_hybrid=False: this client's servers never all go
