# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``EntropyTokenOutput``: what crosses from the inference server to the agent loops, entropy next to each token.

Kept free of sglang imports on purpose: it is unpickled in every agent-loop worker process (Ray pickles classes by
module), and importing sglang there would cost tens of seconds per process for nothing.
"""

from __future__ import annotations

from typing import Any

from verl.workers.rollout.replica import TokenOutput

# sglang's finish_reason type of an aborted request; verl's sglang server passes it on as ``stop_reason``.
ABORTED_STOP_REASON = "abort"


class EntropyTokenOutput(TokenOutput):
    """verl's ``TokenOutput`` plus the entropy (nats) of the distribution each token was sampled from.

    ``entropy[i]`` belongs to ``token_ids[i]``; ``None`` when the request did not ask for logprobs (sglang computes
    entropy only for requests with ``return_logprob=True``).
    """

    entropy: list[float] | None = None
    # Entropy mode "support" only (issue 48): per token ``(size, kept_mass, sampled_logprob, token_ids | None)``, the
    # support sglang sampled it from (``sglang/support.py``); ``log_probs`` then hold each ``sampled_logprob``, the
    # log-prob renormalised over that support: the distribution the token was drawn from. Typed loosely: pydantic
    # would otherwise walk every id of every token.
    support: list[Any] | None = None
    # The request's trajectory was aborted by session (``abort_sessions``: the trainer dropped its group), as opposed
    # to every request of the server at once (a pause around a weight update, which a resuming client retries).
    session_aborted: bool = False


def empty_token_output(
    return_logprob: bool, stop_reason: str | None, extra_fields: dict | None = None, session_aborted: bool = False
) -> EntropyTokenOutput:
    """The output of a request that produced no token: empty lists where logprobs were requested, else ``None``."""
    empty = [] if return_logprob else None
    return EntropyTokenOutput(
        token_ids=[],
        log_probs=empty,
        entropy=empty,
        stop_reason=stop_reason,
        extra_fields=extra_fields or {},
        session_aborted=session_aborted,
    )
