# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's sglang server, serving per-token entropy next to the sampled tokens.

First stop of the verl side: sglang's ``meta_info["output_token_entropy"]`` becomes ``EntropyTokenOutput.entropy``.

``EntropySGLangHttpServer`` differs from verl's ``SGLangHttpServer`` in four places:
  - ``launch_server`` refuses settings under which entropy would be missing or misaligned, then turns entropy
    extraction on in this process (:func:`treetune_verl.sglang.engine.install`: configuration exported for the
    spawned scheduler, ``custom_run_scheduler_process`` injected, TokenizerManager patched) and calls the parent.
  - ``generate`` runs the parent's ``generate`` unchanged and returns an :class:`EntropyTokenOutput` whose
    ``entropy`` is sglang's ``meta_info["output_token_entropy"]``. The parent reads the request's output from
    ``self.tokenizer_manager`` and drops ``meta_info``; a thin proxy of the TokenizerManager keeps the
    ``meta_info`` of the requests this method is waiting for, so no verl code is copied. An output with no token
    (a request aborted while queued, or a turn with no budget left) is returned as an empty output with its stop
    reason; the parent would fail on it (``zip`` of nothing, ``async_sglang_server.py:390-394``).
  - ``abort_sessions`` aborts every request of the given trajectories (session prefixes, :mod:`.session`) inside
    sglang's scheduler, and answers their later turns at once with an empty ``"abort"`` output until
    ``forget_sessions``: a scoped abort, not verl's global ``abort_all_requests`` / pause.
  - ``abort_all_requests`` (verl's pause, carry-over on verl 0.9.1 calls it every step) returns once the running
    requests have ended instead of a second later (sglang's poll).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from verl.workers.rollout.replica import get_rollout_replica_class

from treetune_verl.patching import Replace, is_replaced
from treetune_verl.rollout.rollout_config import check_rollout_config, support_replay
from treetune_verl.rollout.session import is_eval_request, session_of
from treetune_verl.rollout.token_ledger import TokenLedger
from treetune_verl.rollout.token_output import ABORTED_STOP_REASON, EntropyTokenOutput, empty_token_output
from treetune_verl.sglang.engine import install
from treetune_verl.sglang.support import TOKEN_SUPPORT_FIELDS
from treetune_verl.sglang.tokenizer_patches import META_INFO_ENTROPY_KEY, META_INFO_SUPPORT_KEY
from treetune_verl.verl_guard import VERL

# verl's own loader (replica.py `_load_sglang`) imports sglang with its vLLM stand-in and SGLANG_USE_CPU_ENGINE
# set; importing async_sglang_server first would skip that and fail where vLLM is not installed.
SGLangReplica = get_rollout_replica_class("sglang")
from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer  # noqa: E402

# sglang's pause polls whether requests still run every 1.0 s (tokenizer_manager.py pause_generation); ours polls
# this often, for at most that second.
PAUSE_POLL_S = 0.01
PAUSE_WAIT_S = 1.0
logger = logging.getLogger(__name__)


class _NoOutputTokens(Exception):
    """A request finished without a single output token; carries its ``meta_info`` (finish reason)."""

    def __init__(self, meta_info: dict[str, Any]) -> None:
        super().__init__(meta_info.get("finish_reason"))
        self.meta_info = meta_info


class _TappedStream:
    """One request's output stream; records each chunk's ``meta_info`` into ``sink[rid]`` as it passes.

    A finished chunk without output tokens raises :class:`_NoOutputTokens` instead of reaching verl's parent
    ``generate``, which cannot unpack an empty token list.
    """

    def __init__(self, stream: Any, sink: dict[str, Any], rid: str) -> None:
        self._stream, self._sink, self._rid = stream, sink, rid

    def __aiter__(self) -> _TappedStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        chunk = await self._stream.__anext__()
        meta_info = chunk.get("meta_info") or {}
        if self._rid in self._sink:
            self._sink[self._rid] = meta_info
        if not chunk.get("output_ids") and meta_info.get("finish_reason") is not None:
            raise _NoOutputTokens(meta_info)
        return chunk


class _MetaInfoTap:
    """Proxy of sglang's TokenizerManager that keeps ``meta_info`` for the request ids it was told to expect.

    Every attribute read and write goes to the real TokenizerManager; ``generate_request`` is wrapped only for
    expected ids, so other callers (the HTTP endpoints, which hold the real object) are unaffected and nothing
    accumulates for requests nobody collects.
    """

    def __init__(self, tokenizer_manager: Any) -> None:
        object.__setattr__(self, "_tokenizer_manager", tokenizer_manager)
        object.__setattr__(self, "_meta_info", {})

    def expect(self, rid: str) -> None:
        self._meta_info[rid] = None

    def collect(self, rid: str) -> dict[str, Any] | None:
        return self._meta_info.pop(rid, None)

    def generate_request(self, obj: Any, request: Any = None) -> Any:
        stream = self._tokenizer_manager.generate_request(obj, request)
        rid = getattr(obj, "rid", None)
        if isinstance(rid, str) and rid in self._meta_info:
            return _TappedStream(stream, self._meta_info, rid)
        return stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer_manager, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tokenizer_manager, name, value)


def _untapped(tokenizer_manager: Any) -> str | None:
    if isinstance(tokenizer_manager, _MetaInfoTap) or not hasattr(tokenizer_manager, "generate_request"):
        return f"is {tokenizer_manager!r}, not a TokenizerManager (has the server been launched?)"
    return None


SAMPLED_LOGPROB = TOKEN_SUPPORT_FIELDS.index("sampled_logprob")  # in each token's support tuple


class EntropySGLangHttpServer(SGLangHttpServer):
    """verl's ``SGLangHttpServer`` whose ``generate`` returns :class:`EntropyTokenOutput` (entropy in nats).

    Entropy settings come from ``actor_rollout_ref.rollout.custom.entropy`` (``top_k``: 0 = full vocabulary;
    ``mode``: ``raw`` or ``tempered``; see :mod:`treetune_verl.sglang.entropy`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # session -> time.monotonic() of its abort; emptied by forget_sessions at the end of each step
        self._aborted_sessions: dict[str, float] = {}
        self._token_ledger: TokenLedger | None = None  # carry-over on verl 0.9.1 only (enable_token_ledger)
        self._replay_support = True  # custom.entropy.replay, read with the other settings by launch_server

    async def launch_server(self, master_address: str | None = None, master_port: int | None = None) -> None:
        """Refuse unusable settings, turn entropy extraction on, then launch exactly as verl does.

        verl's module imported ``_launch_subprocesses`` by name, so the wrapper that :func:`install` puts on
        sglang's ``engine._launch_subprocesses`` does not guard this path; the same checks run here, on the server
        arguments verl is about to build, before anything is spawned.

        Raises:
            ValueError: ``calculate_log_probs`` is off, or the entropy section is invalid.
            UnsupportedSGLangError: data-parallel sglang, speculative decoding, pipeline parallelism or
                disaggregation (the injected scheduler would be bypassed or entropy misaligned).
        """
        entropy = check_rollout_config(self.config)
        self._replay_support = support_replay(self.config)
        install(top_k=entropy.top_k, mode=entropy.mode)
        await super().launch_server(master_address=master_address, master_port=master_port)

    def _meta_info_tap(self) -> _MetaInfoTap:
        """verl's ``self.tokenizer_manager`` behind our tap: put there at the first request (a ``Replace``), found as
        ours at every later one (one lookup per request)."""
        if not is_replaced(self, "tokenizer_manager"):
            VERL.replace(
                Replace(
                    self,
                    "tokenizer_manager",
                    _MetaInfoTap,
                    _untapped,
                    why="an attribute of our own server, set by verl's launch_server: the TokenizerManager behind a tap",
                    where="SGLangHttpServer.tokenizer_manager",
                )
            )
        return self.tokenizer_manager

    async def generate(
        self, prompt_ids: Any, sampling_params: dict[str, Any], request_id: str, **kwargs: Any
    ) -> EntropyTokenOutput:
        """The parent's ``generate``, plus ``entropy``: one value per returned token when logprobs were requested.

        ``kwargs``: the parent's other parameters, passed on as given (verl 0.7.1: ``image_data``, ``video_data``;
        verl 0.9.1 adds ``bootstrap_host`` / ``_port`` / ``_room`` of PD disaggregation, which entropy refuses).

        Raises:
            RuntimeError: logprobs were requested but sglang returned no (or misaligned) entropy, i.e. the
                entropy patches are not active in this server's processes.

        In entropy mode ``support`` the output also carries each token's sampled ``support`` and its ``log_probs``
        are the log-probs renormalised over it (sglang's own are over the whole tempered distribution).
        """
        return_logprob = bool(sampling_params.get("logprobs", False))  # the parent pops it
        if session_of(request_id) in self._aborted_sessions:
            return self._no_token_output(return_logprob, ABORTED_STOP_REASON, session_aborted=True)
        tap = self._meta_info_tap()
        tap.expect(request_id)
        started = time.monotonic()
        try:
            output = await super().generate(prompt_ids, sampling_params, request_id, **kwargs)
        except _NoOutputTokens as empty:
            stop_reason = (empty.meta_info["finish_reason"] or {}).get("type")
            self._log_served(request_id, stop_reason, 0, started)
            self._log_cut(request_id, stop_reason, 0)
            self._count_tokens(request_id, 0)
            return self._no_token_output(
                return_logprob, stop_reason, session_aborted=self._session_aborted(request_id, stop_reason)
            )
        finally:
            meta_info = tap.collect(request_id)
        self._log_served(request_id, output.stop_reason, len(output.token_ids), started)
        self._log_cut(request_id, output.stop_reason, len(output.token_ids))
        self._count_tokens(request_id, len(output.token_ids))
        entropy = support = None
        fields = dict(output)
        if return_logprob:
            entropy = (meta_info or {}).get(META_INFO_ENTROPY_KEY)
            if entropy is None:
                raise RuntimeError(
                    f"request {request_id}: logprobs were requested but sglang returned no output_token_entropy; "
                    "the entropy patches are not active in this server (launch_server not run through "
                    "EntropySGLangHttpServer?)"
                )
            if len(entropy) != len(output.token_ids):
                raise RuntimeError(f"request {request_id}: {len(entropy)} entropies for {len(output.token_ids)} tokens")
            support = (meta_info or {}).get(META_INFO_SUPPORT_KEY)  # entropy mode "support" only
            if support is not None:
                if len(support) != len(output.token_ids):
                    raise RuntimeError(
                        f"request {request_id}: {len(support)} supports for {len(output.token_ids)} tokens"
                    )
                # the behaviour log-probs of the distribution each token was drawn from: renormalised over its support
                fields["log_probs"] = [float(token[SAMPLED_LOGPROB]) for token in support]
                if not self._replay_support:  # the actor stays full-vocabulary: nothing carries the supports
                    support = None
        session_aborted = self._session_aborted(request_id, output.stop_reason)
        return EntropyTokenOutput(**fields, entropy=entropy, support=support, session_aborted=session_aborted)

    def _count_tokens(self, request_id: str, tokens: int) -> None:
        """Add a turn's tokens to the ledger (the forecast's E rides along with a session, trains nothing: left out)."""
        session = session_of(request_id)
        if self._token_ledger is not None and session is not None and not is_eval_request(request_id):
            self._token_ledger.add(session, tokens)

    async def enable_token_ledger(self) -> None:
        """Count the tokens of every training session from now on (``rollout/token_ledger.py``; idempotent)."""
        if self._token_ledger is None:
            self._token_ledger = TokenLedger()

    async def generated_tokens(self) -> int:
        """Training sessions' tokens generated since the last call (0 without the ledger)."""
        return self._token_ledger.take_generated() if self._token_ledger is not None else 0

    async def session_tokens(self, sessions: list[str], forget: bool = False) -> int:
        """Every token generated so far for these sessions (0 without the ledger); ``forget``: drop them."""
        return self._token_ledger.session_tokens(sessions, forget) if self._token_ledger is not None else 0

    async def ledger_sessions(self) -> int:
        """How many sessions the ledger still remembers (0 without it)."""
        return self._token_ledger.sessions() if self._token_ledger is not None else 0

    @staticmethod
    def _log_served(request_id: str, stop_reason: str | None, tokens: int, started: float) -> None:
        """Every request's tokens and seconds in this server (DEBUG): across a run's requests of different lengths,
        the slope of seconds over tokens is a decode step's seconds (issue 49's bench, ``bench_abort_latency.py``)."""
        logger.debug(
            "served: request %s, %d tokens in %.4f s, stop %s",
            request_id,
            tokens,
            time.monotonic() - started,
            stop_reason,
        )

    def _log_cut(self, request_id: str, stop_reason: str | None, tokens: int) -> None:
        """A request of an aborted session, returned: how long after the abort, how many tokens, cut or not (the
        abort's latency on the engine's side, issue 49; one line per request that was in flight at the abort)."""
        aborted_at = self._aborted_sessions.get(session_of(request_id))
        if aborted_at is not None:
            logger.info(
                "abort latency: request %s of an aborted session returned %.3f s after the abort, %d tokens, stop %s",
                request_id,
                time.monotonic() - aborted_at,
                tokens,
                stop_reason,
            )

    def _session_aborted(self, request_id: str, stop_reason: str | None) -> bool:
        """Whether the request stopped because its session was aborted (not by a pause of every request)."""
        return stop_reason == ABORTED_STOP_REASON and session_of(request_id) in self._aborted_sessions

    def _no_token_output(
        self, return_logprob: bool, stop_reason: str | None, session_aborted: bool = False
    ) -> EntropyTokenOutput:
        """The output of a request that produced no token, with the server's ``extra_fields`` as verl sets them."""
        return empty_token_output(return_logprob, stop_reason, {"global_steps": self.global_steps}, session_aborted)

    async def abort_sessions(self, sessions: list[str]) -> None:
        """Abort every request of these trajectories (session prefixes) in sglang; their later turns return at once.

        Queued requests come back with no token, running ones with their partial tokens, both with stop reason
        ``"abort"``. One ``AbortReq`` per session goes to the scheduler, which matches rids by prefix
        (``scheduler.py`` ``abort_request``); sglang's own ``TokenizerManager.abort_request`` cannot be used, it
        drops any rid it does not hold exactly. A turn still being tokenised when the abort arrives runs to its
        end (its row is discarded by the caller all the same). The messages are separate, so a queued request the
        scheduler admits between two of them (a running one aborted just before freed its slot) comes back with the
        few tokens it decoded, still ``"abort"``.
        """
        from sglang.srt.managers.io_struct import AbortReq

        for session in sessions:
            if session_of(session) != session:
                raise ValueError(f"abort_sessions: {session!r} is not a session prefix (treetune_verl.rollout.session)")
            self._aborted_sessions[session] = time.monotonic()
            self.tokenizer_manager.send_to_scheduler.send_pyobj(AbortReq(rid=session))

    async def forget_sessions(self, sessions: list[str]) -> None:
        """Drop these sessions from the aborted set (the step that aborted them is over)."""
        for session in sessions:
            self._aborted_sessions.pop(session, None)

    async def abort_all_requests(self) -> None:
        """verl's pause (sglang's ``pause_generation(mode="abort")``: every request aborted, later ones held until
        ``resume_generation``), without its idle second.

        sglang aborts every request, then sleeps 1.0 s whenever one still runs at its check, which it always does
        right after the abort (the request ends at the scheduler's next iteration): a second on the trainer's path at
        every pause. Here the requests are aborted first and awaited at a 10 ms poll (at most a second); sglang's
        pause then finds none running and returns at its first check. A request arriving in between is aborted by
        sglang's pause as before.
        """
        manager = self.tokenizer_manager
        if getattr(self, "node_rank", 0) == 0:  # verl 0.9.1: only the first node's server serves control calls
            manager.abort_request(abort_all=True)
            deadline = time.monotonic() + PAUSE_WAIT_S
            while await manager.model_update_lock.is_locked() and time.monotonic() < deadline:
                await asyncio.sleep(PAUSE_POLL_S)
        await super().abort_all_requests()

    async def aborted_session_count(self) -> int:
        """How many aborted sessions this server still remembers (0 between steps)."""
        return len(self._aborted_sessions)
