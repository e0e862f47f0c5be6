# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What a managed session generates with: token ids in, token ids + logprobs + entropy out, one session per rid prefix.

- :class:`EngineBackend`: a real in-process ``sglang.Engine`` started after :func:`treetune_verl.sglang.engine.install`
  (entropy on). sglang is imported lazily, in its methods only, so importing this module in an agent-loop worker does
  not import sglang.
- :class:`VerlBackend`: verl's ``AsyncLLMServerManager`` inside an agent loop (our ``SessionServerManager`` names
  every request after the trajectory's session; the server is ``EntropySGLangHttpServer``).

A backend that cannot return token ids, logprobs and entropy (an OpenAI-style HTTP endpoint) is refused by
:func:`check_backend`: training on re-tokenized text is exactly the drift this package exists to avoid.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from uuid import uuid4

from treetune_verl.agent_loop.recorder import served_entropy
from treetune_verl.agent_loop.trajectory import CURRENT_TRAJECTORY
from treetune_verl.rollout.session import new_session_id, turn_request_id

# verl 0.9.1: a server output's weight version (llm_server.py LLMServerClient.generate), which its agent loops carry
# into each row's min / max (the V1 trainer's staleness tags, agent_loop_tq.py).
WEIGHT_VERSION_KEY = "global_steps"


@dataclass
class Generation:
    """One sampled continuation. ``token_ids``, ``logprobs`` (nats) and ``entropy`` (nats) have one length.

    ``finish_reason``: sglang's ``"stop"`` (end-of-turn token or stop string), ``"length"`` or ``"abort"``.
    """

    token_ids: list[int]
    logprobs: list[float]
    entropy: list[float]
    finish_reason: str | None

    def __post_init__(self) -> None:
        if not (len(self.token_ids) == len(self.logprobs) == len(self.entropy)):
            raise RuntimeError(
                f"backend returned {len(self.token_ids)} token ids, {len(self.logprobs)} logprobs and "
                f"{len(self.entropy)} entropies for one continuation"
            )


@runtime_checkable
class Backend(Protocol):
    """What :class:`~treetune_verl.managed.server.ManagedServer` needs from a backend."""

    context_length: int  # tokens: prompt + generated must fit

    def open_session(self) -> str | None:
        """The rid prefix of a new session (``None``: the backend cannot name its requests)."""

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], n: int, session: str | None
    ) -> list[Generation]:
        """``n`` independent continuations of ``prompt_ids``."""

    async def abort(self, session: str) -> None:
        """Abort every request of ``session`` still running."""


def check_backend(backend: Any) -> None:
    """Refuse a backend that cannot give token ids, logprobs and entropy (e.g. ``openai.AsyncOpenAI``)."""
    if isinstance(backend, Backend):
        return
    raise TypeError(
        f"{type(backend).__name__} is not a managed-session backend: it must return the sampled token ids, their "
        "logprobs and entropy (an OpenAI-style HTTP endpoint returns text, and training on re-tokenized text "
        "trains on tokens the policy never sampled). Use EngineBackend (in-process sglang.Engine after "
        "treetune_verl.sglang.engine.install()) or VerlBackend (inside a verl agent loop)"
    )


class EngineBackend:
    """A real in-process ``sglang.Engine`` with entropy extraction installed.

    Every call runs on the Engine's own event loop (``engine.loop``: its TokenizerManager lives there), e.g.
    ``engine.loop.run_until_complete(agent(...))``. Each request is sent with ``rid = <session prefix><hex>``; the
    ``n`` continuations of one call are ``n`` requests (sglang's prefix cache shares the prompt).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.context_length = int(engine.tokenizer_manager.context_len)

    def open_session(self) -> str:
        return new_session_id()

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], n: int, session: str | None
    ) -> list[Generation]:
        if asyncio.get_running_loop() is not self.engine.loop:
            raise RuntimeError(
                "EngineBackend must run on the Engine's event loop: engine.loop.run_until_complete(your_coroutine)"
            )
        outputs = await asyncio.gather(*[self._one(prompt_ids, sampling_params, session) for _ in range(n)])
        return list(outputs)

    async def _one(self, prompt_ids: list[int], sampling_params: dict[str, Any], session: str | None) -> Generation:
        rid = turn_request_id(session) if session else uuid4().hex
        out = await self.engine.async_generate(
            input_ids=list(prompt_ids), sampling_params=dict(sampling_params), return_logprob=True, rid=rid
        )
        meta = out["meta_info"]
        entropy = meta.get("output_token_entropy")
        if entropy is None:
            raise RuntimeError(
                "the Engine returned no output_token_entropy: call treetune_verl.sglang.engine.install() before "
                "creating the sglang.Engine"
            )
        logprobs = [float(lp) for lp, _, _ in meta["output_token_logprobs"]]
        token_ids = [int(t) for _, t, _ in meta["output_token_logprobs"]]
        finish = meta.get("finish_reason") or {}
        return Generation(token_ids, logprobs, [float(e) for e in entropy], finish.get("type"))

    async def abort(self, session: str) -> None:
        # sglang's scheduler aborts every rid starting with an AbortReq's rid (scheduler.py abort_request); its
        # TokenizerManager.abort_request matches exactly, so the prefix goes to the scheduler directly, as
        # EntropySGLangHttpServer.abort_sessions does.
        from sglang.srt.managers.io_struct import AbortReq

        self.engine.tokenizer_manager.send_to_scheduler.send_pyobj(AbortReq(rid=session))


class VerlBackend:
    """verl's server manager inside an agent loop: ``generate`` returns ``EntropyTokenOutput``.

    Args:
        server_manager: the agent loop's ``server_manager`` (our ``SessionServerManager`` in our workers).
        context_length: prompt + response budget in tokens (the rollout's ``max_model_len``, else
            ``prompt_length + response_length``).
        default_sampling: the worker's sampling parameters (``temperature``, ``top_p``, ``top_k``, ...), used for
            every key a call does not set. ``logprobs`` is always on.

    The session is the calling trajectory's (the worker sets it; every turn's rid carries it); one sticky request
    id keeps all turns of a session on one server, for its prefix cache. ``weight_versions``: the weight version
    (verl 0.9.1's ``extra_fields["global_steps"]``) of every continuation that carried one, in order.
    """

    def __init__(self, server_manager: Any, context_length: int, default_sampling: dict[str, Any] | None = None):
        self.server_manager = server_manager
        self.context_length = int(context_length)
        self.default_sampling = dict(default_sampling or {})
        self._sticky_id = uuid4().hex
        self.weight_versions: list[int] = []

    def open_session(self) -> str | None:
        trajectory = CURRENT_TRAJECTORY.get()
        return trajectory.session if trajectory is not None else None

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], n: int, session: str | None
    ) -> list[Generation]:
        params = {**self.default_sampling, **sampling_params, "logprobs": True}
        if "max_new_tokens" in params:  # verl's server reads max_tokens (vllm-style) or max_new_tokens
            params["max_tokens"] = params.pop("max_new_tokens")
        outputs = await asyncio.gather(
            *[
                self.server_manager.generate(
                    request_id=self._sticky_id, prompt_ids=list(prompt_ids), sampling_params=dict(params)
                )
                for _ in range(n)
            ]
        )
        generations = []
        for output in outputs:
            version = (getattr(output, "extra_fields", None) or {}).get(WEIGHT_VERSION_KEY)
            if version is not None:
                self.weight_versions.append(int(version))
            if output.log_probs is None:
                raise RuntimeError("the verl server returned no log_probs although logprobs were requested")
            generations.append(
                Generation(
                    list(output.token_ids),
                    [float(v) for v in output.log_probs],
                    served_entropy(output),
                    output.stop_reason,
                )
            )
        return generations

    async def abort(self, session: str) -> None:
        abort_sessions = getattr(self.server_manager, "abort_sessions", None)
        if abort_sessions is None:
            raise RuntimeError(
                f"{type(self.server_manager).__name__} cannot abort by session: use treetune_verl's "
                "EntropyAgentLoopManager (its workers' SessionServerManager)"
            )
        await abort_sessions([session])
        await self.server_manager.forget_sessions([session])
