# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Real sglang 0.5.6.post2 objects for the in-process tests of the entropy patches, and the few stand-ins left.

Built here, all real: ``Scheduler`` (fully constructed on the tiny model with the CPU Engine settings, gloo process
group included), ``TokenizerManager`` and ``DetokenizerManager`` (constructed with their own ``__init__``), scheduler
``Req``s, ``ReqState``s and ``BatchStrOutput``s. What stays a stand-in, and why:

* :class:`CaptureSocket` replaces the zmq socket *inside* the real ``SenderWrapper``: the tests read what the
  scheduler sends, and no detokenizer process listens.
* :class:`TreeCache` wraps the real ``RadixCache`` where results are synthetic (``scheduler_scenario.py``) and
  replaces only ``cache_finished_req`` / ``cache_unfinished_req``, the two calls that move a request's KV slots.
  Those requests never went through the real batch preparation (no KV slots, ``req.req_pool_idx is None``): with
  the real cache, the first prefill fails in ``RadixCache.cache_unfinished_req`` -> ``ReqToTokenPool.write`` with
  ``RuntimeError: The expanded size of the tensor (1028) must match the existing size (0) ...``. The real model
  forward, real KV and real radix cache run in ``test_output_pipeline_on_cpu``'s event-loop test.

Importing this module imports sglang; the conftest imports it lazily so that the plain-torch tests do not.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from sglang.srt.entrypoints import engine as engine_mod
from sglang.srt.layers import sampler as sampler_mod
from sglang.srt.managers.detokenizer_manager import DetokenizerManager
from sglang.srt.managers.io_struct import BatchStrOutput, GenerateReqInput
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager
from sglang.srt.model_executor import model_runner as model_runner_mod
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import PortArgs, ServerArgs

from treetune_verl.sglang.patching import upstream_value

VOCAB = 64  # vocabulary of the synthetic logits and of the synthetic scheduler Reqs (token ids stay below it)
EOS = 2

# Every attribute any patch of the sglang side may replace, as (owner, name). Snapshotted before each test that
# patches and restored afterwards, so the pytest session sees sglang exactly as it was.
SCHEDULER_TARGETS: list[tuple[Any, str]] = [
    (sampler_mod, "Sampler"),
    (sampler_mod, "top_k_top_p_min_p_sampling_from_probs_torch"),
    (model_runner_mod, "Sampler"),
    (Scheduler, "process_batch_result_prefill"),
    (Scheduler, "process_batch_result_decode"),
    (Scheduler, "init_sockets"),
    (Scheduler, "get_internal_state"),
]
TOKENIZER_TARGETS: list[tuple[Any, str]] = [
    (TokenizerManager, "convert_logprob_style"),
    (TokenizerManager, "add_logprob_to_meta_info"),
]
ENGINE_TARGETS: list[tuple[Any, str]] = [
    (engine_mod, "run_scheduler_process"),
    (engine_mod, "_launch_subprocesses"),
]
ALL_TARGETS = SCHEDULER_TARGETS + TOKENIZER_TARGETS + ENGINE_TARGETS


def current(targets: list[tuple[Any, str]]) -> list[Any]:
    return [getattr(owner, name) for owner, name in targets]


def snapshot(monkeypatch: pytest.MonkeyPatch, targets: list[tuple[Any, str]]) -> None:
    """Record ``owner.name`` for each target so that monkeypatch puts it back (deleting it if it was inherited)."""
    for owner, name in targets:
        monkeypatch.setattr(owner, name, getattr(owner, name))


def unpatch(monkeypatch: pytest.MonkeyPatch, targets: list[tuple[Any, str]]) -> None:
    """Snapshot, then set each target to its upstream object, whatever an earlier test of the session left."""
    snapshot(monkeypatch, targets)
    for owner, name in targets:
        monkeypatch.setattr(owner, name, upstream_value(owner, name))


class CaptureSocket:
    """Stands in for the zmq PUSH socket inside sglang's ``SenderWrapper``: keeps every object sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_pyobj(self, obj: Any) -> None:
        self.sent.append(obj)


class TreeCache:
    """The scheduler's real radix cache, except for the two calls that free a request's KV slots: those only record
    the request (synthetic results; see the module docstring). Everything else (sizes read by the scheduler's
    periodic stats, ...) goes to the real cache."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.finished: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        self.finished.append(req.rid)

    def cache_unfinished_req(self, req: Req, chunked: bool = False) -> None:
        pass


def close_zmq(*sockets: Any) -> None:
    """Close the zmq contexts of these sockets, with every socket made in them (linger 0)."""
    contexts = []
    for socket in sockets:
        if socket is not None and not isinstance(socket, CaptureSocket) and socket.context not in contexts:
            contexts.append(socket.context)
    for context in contexts:
        context.destroy(linger=0)


def build_scheduler(server_args: ServerArgs, *, overlap: bool) -> tuple[Scheduler, list[Any]]:
    """A fully constructed real ``Scheduler`` (tp/pp/dp rank 0, as sglang's Engine starts it) on CPU.

    Its ``__init__`` loads the model, joins a one-rank gloo process group, sizes the KV pool and runs the (patched,
    if the caller applied the patches) ``init_sockets``. The zmq sockets inside its two ``SenderWrapper``s are then
    swapped for :class:`CaptureSocket`s. Returns the scheduler and its zmq sockets (for :func:`close_zmq`).
    """
    args = copy.copy(server_args)
    args.disable_overlap_schedule = not overlap
    # The scheduler's watchdog thread (one per Scheduler, never stopped) signals the *parent* process if cur_batch
    # stays set without progress for this long; in this process that parent is the shell running pytest.
    args.watchdog_timeout = 10**9
    scheduler = Scheduler(args, PortArgs.init_new(args), gpu_id=0, tp_rank=0, moe_ep_rank=0, pp_rank=0, dp_rank=None)
    sockets = [scheduler.recv_from_tokenizer, scheduler.recv_from_rpc]
    for sender in (scheduler.send_to_detokenizer, scheduler.send_to_tokenizer):
        sockets.append(sender.socket)
        sender.socket = CaptureSocket()
    return scheduler, sockets


def build_tokenizer_manager(server_args: ServerArgs) -> TokenizerManager:
    """A real ``TokenizerManager`` (its own ``__init__``: tokenizer, model config, zmq sockets on fresh ipc names)."""
    return TokenizerManager(copy.copy(server_args), PortArgs.init_new(server_args))


def build_detokenizer_manager(server_args: ServerArgs) -> DetokenizerManager:
    """A real ``DetokenizerManager`` (its own ``__init__``: the model's tokenizer, zmq sockets on fresh ipc names)."""
    return DetokenizerManager(copy.copy(server_args), PortArgs.init_new(server_args))


def make_req(
    rid: str,
    max_new_tokens: int,
    *,
    stream: bool,
    prompt_len: int = 5,
    stream_interval: int | None = None,
    return_logprob: bool = True,
    eos: int | None = None,
    **sampling: Any,
) -> Req:
    """A real scheduler ``Req`` with normalised and verified ``SamplingParams``."""
    params = SamplingParams(max_new_tokens=max_new_tokens, stream_interval=stream_interval, **sampling)
    params.normalize(None)
    params.verify(VOCAB)
    return Req(
        rid,
        "",
        list(range(3, 3 + prompt_len)),
        params,
        return_logprob=return_logprob,
        stream=stream,
        eos_token_ids={eos} if eos is not None else None,
        vocab_size=VOCAB,
    )


def make_state(rid: str, stream: bool = False, return_logprob: bool = True) -> ReqState:
    """A real ``ReqState`` around a normalised ``GenerateReqInput``."""
    obj = GenerateReqInput(text="hi", rid=rid, return_logprob=return_logprob, stream=stream)
    obj.normalize_batch_and_arguments()
    return ReqState(out_list=[], finished=False, event=asyncio.Event(), obj=obj, created_time=0.0)


def str_chunk(rows: dict[str, tuple[list[int], list[float], list[float], dict | None]]) -> BatchStrOutput:
    """A real ``BatchStrOutput``; ``rows`` maps rid -> (output_ids, logprobs, entropies, finish reason)."""
    rids = list(rows)
    ids, lps, ents, finishes = (list(col) for col in zip(*rows.values(), strict=True))
    empty = [[] for _ in rids]
    return BatchStrOutput(
        rids=rids,
        finished_reasons=finishes,
        output_strs=["x" * len(i) for i in ids],
        output_ids=ids,
        prompt_tokens=[3] * len(rids),
        completion_tokens=[0] * len(rids),
        cached_tokens=[0] * len(rids),
        input_token_logprobs_val=empty,
        input_token_logprobs_idx=empty,
        output_token_logprobs_val=lps,
        output_token_logprobs_idx=ids,
        input_top_logprobs_val=empty,
        input_top_logprobs_idx=empty,
        output_top_logprobs_val=empty,
        output_top_logprobs_idx=empty,
        input_token_ids_logprobs_val=empty,
        input_token_ids_logprobs_idx=empty,
        output_token_ids_logprobs_val=empty,
        output_token_ids_logprobs_idx=empty,
        output_token_entropy_val=ents,
        output_hidden_states=None,
        placeholder_tokens_idx=None,
        placeholder_tokens_val=None,
        retraction_counts=[0] * len(rids),
        spec_verify_ct=[0] * len(rids),
        spec_accepted_tokens=[0] * len(rids),
        queue_time=[0.0] * len(rids),
        forward_entry_time=[0.0] * len(rids),
        prefill_launch_delay=[0.0] * len(rids),
        prefill_launch_latency=[0.0] * len(rids),
    )
