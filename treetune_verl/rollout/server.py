# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's sglang server, serving per-token entropy next to the sampled tokens.

First stop of the verl side: sglang's ``meta_info["output_token_entropy"]`` becomes ``EntropyTokenOutput.entropy``.

``EntropySGLangHttpServer`` differs from verl's ``SGLangHttpServer`` in two places:
  - ``launch_server`` refuses settings under which entropy would be missing or misaligned, then turns entropy
    extraction on in this process (:func:`treetune_verl.sglang.engine.install`: configuration exported for the
    spawned scheduler, ``custom_run_scheduler_process`` injected, TokenizerManager patched) and calls the parent.
  - ``generate`` runs the parent's ``generate`` unchanged and returns an :class:`EntropyTokenOutput` whose
    ``entropy`` is sglang's ``meta_info["output_token_entropy"]``. The parent reads the request's output from
    ``self.tokenizer_manager`` and drops ``meta_info``; a thin proxy of the TokenizerManager keeps the
    ``meta_info`` of the requests this method is waiting for, so no verl code is copied.
"""

from __future__ import annotations

from typing import Any

from verl.workers.rollout.replica import get_rollout_replica_class

from treetune_verl.rollout.rollout_config import check_rollout_config
from treetune_verl.rollout.token_output import EntropyTokenOutput
from treetune_verl.sglang.engine import install
from treetune_verl.sglang.tokenizer_patches import META_INFO_ENTROPY_KEY

# verl's own loader (replica.py `_load_sglang`) imports sglang with its vLLM stand-in and SGLANG_USE_CPU_ENGINE
# set; importing async_sglang_server first would skip that and fail where vLLM is not installed.
SGLangReplica = get_rollout_replica_class("sglang")
from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer  # noqa: E402


class _TappedStream:
    """One request's output stream; records each chunk's ``meta_info`` into ``sink[rid]`` as it passes."""

    def __init__(self, stream: Any, sink: dict[str, Any], rid: str) -> None:
        self._stream, self._sink, self._rid = stream, sink, rid

    def __aiter__(self) -> _TappedStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        chunk = await self._stream.__anext__()
        if self._rid in self._sink:
            self._sink[self._rid] = chunk.get("meta_info")
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


class EntropySGLangHttpServer(SGLangHttpServer):
    """verl's ``SGLangHttpServer`` whose ``generate`` returns :class:`EntropyTokenOutput` (entropy in nats).

    Entropy settings come from ``actor_rollout_ref.rollout.custom.entropy`` (``top_k``: 0 = full vocabulary;
    ``mode``: ``raw`` or ``tempered``; see :mod:`treetune_verl.sglang.entropy`).
    """

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
        install(top_k=entropy.top_k, mode=entropy.mode)
        await super().launch_server(master_address=master_address, master_port=master_port)

    async def generate(
        self,
        prompt_ids: Any,
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
    ) -> EntropyTokenOutput:
        """The parent's ``generate``, plus ``entropy``: one value per returned token when logprobs were requested.

        Raises:
            RuntimeError: logprobs were requested but sglang returned no (or misaligned) entropy, i.e. the
                entropy patches are not active in this server's processes.
        """
        return_logprob = bool(sampling_params.get("logprobs", False))  # the parent pops it
        tap = self.tokenizer_manager
        if not isinstance(tap, _MetaInfoTap):
            tap = self.tokenizer_manager = _MetaInfoTap(self.tokenizer_manager)
        tap.expect(request_id)
        try:
            output = await super().generate(
                prompt_ids, sampling_params, request_id, image_data=image_data, video_data=video_data
            )
        finally:
            meta_info = tap.collect(request_id)
        entropy = None
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
        return EntropyTokenOutput(**dict(output), entropy=entropy)
