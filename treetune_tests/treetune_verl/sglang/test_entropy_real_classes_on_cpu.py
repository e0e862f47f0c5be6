# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The entropy patches on sglang 0.5.6.post2's real classes, in this process, without an Engine.

Acceptance point 2 of issue 2, plus the guards and the TokenizerManager side:

* the installed ``EntropySampler`` (subclass of the real ``Sampler``) runs its real ``forward`` on CPU on a real
  ``LogitsProcessorOutput`` and a ``SamplingBatchInfo`` built by sglang from real ``Req`` objects;
* the real (patched) ``Scheduler.process_batch_result_prefill`` / ``process_batch_result_decode``,
  ``stream_output_generation`` and ``abort_request`` run over many steps on real ``Req`` / ``ScheduleBatch`` /
  ``GenerationBatchResult`` objects; the outputs leave through the real ``SenderWrapper`` built by the (patched)
  ``Scheduler.init_sockets``, whose socket is replaced by a capturing one;
* the real ``DetokenizerManager.handle_batch_token_id_out`` and the (patched) ``TokenizerManager`` methods turn those
  outputs into ``meta_info["output_token_entropy"]``;
* version / signature / server-argument guards, idempotence and ``engine.install``.

Only ``self`` is a stand-in (a ``SimpleNamespace`` carrying the attributes those methods read, with the real methods
bound onto it). Every patch, global server argument, environment variable and version string is restored afterwards.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import os
import pickle
import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import sglang
import torch
from sglang.srt import server_args as server_args_mod
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.distributed import parallel_state
from sglang.srt.entrypoints import engine as engine_mod
from sglang.srt.layers import sampler as sampler_mod
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers import scheduler as scheduler_mod
from sglang.srt.managers import scheduler_output_processor_mixin as mixin_mod
from sglang.srt.managers.detokenizer_manager import DetokenizerManager, LimitedCapacityDict
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchStrOutput,
    BatchTokenIDOutput,
    GenerateReqInput,
    GetInternalStateReq,
)
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor import model_runner as model_runner_mod
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from treetune_verl.sglang import engine as tt_engine
from treetune_verl.sglang import scheduler_patches as sp
from treetune_verl.sglang import tokenizer_patches as tp
from treetune_verl.sglang.entropy import (
    ENV_MODE,
    ENV_TOP_K,
    EntropyConfig,
    compute_entropy,
    custom_run_scheduler_process,
)
from treetune_verl.sglang.patching import (
    ENV_ALLOW_UNSUPPORTED,
    UnsupportedSGLangError,
    check_sglang_version,
    check_signature,
    is_patched,
    original_of,
)

SUPPORTED = "0.5.6.post2"
VOCAB = 64  # vocabulary of the synthetic logits and of the scheduler Reqs (token ids stay below it)
EOS = 2

# Every attribute any patch in this file may replace, as (owner, name). Snapshotted before each test that patches
# and restored afterwards, so the pytest session sees sglang exactly as it was.
SCHEDULER_TARGETS: list[tuple[Any, str]] = [
    (sampler_mod, "Sampler"),
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


# ----------------------------------------------------------------------------------------------------------------
# Fixtures: global server args, restorable patches, stand-in `self` objects
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_server_args(tiny_model_dir) -> ServerArgs:
    """Real ``ServerArgs`` for a CPU scheduler on the tiny model (built once: construction reads the model config)."""
    return ServerArgs(
        model_path=str(tiny_model_dir),
        device="cpu",
        sampling_backend="pytorch",
        attention_backend="torch_native",
        grammar_backend="none",
        disable_cuda_graph=True,
        skip_server_warmup=True,
        dtype="float32",
    )


@pytest.fixture
def server_args(base_server_args, monkeypatch) -> ServerArgs:
    """A fresh copy installed as sglang's global server args for this test (restored afterwards)."""
    monkeypatch.setattr(server_args_mod, "_global_server_args", server_args_mod._global_server_args)  # restore
    args = copy.copy(base_server_args)
    server_args_mod.set_global_server_args_for_scheduler(args)
    return args


def _snapshot(monkeypatch: pytest.MonkeyPatch, targets: list[tuple[Any, str]]) -> None:
    """Record ``owner.name`` for each target so that monkeypatch puts it back (deleting it if it was inherited)."""
    for owner, name in targets:
        monkeypatch.setattr(owner, name, getattr(owner, name))


def _unpatch(monkeypatch: pytest.MonkeyPatch, targets: list[tuple[Any, str]]) -> None:
    """Snapshot, then set each target to its upstream object, whatever an earlier test of the session left."""
    _snapshot(monkeypatch, targets)
    for owner, name in targets:
        monkeypatch.setattr(owner, name, original_of(getattr(owner, name)))


@pytest.fixture
def pristine(monkeypatch, server_args) -> None:
    """Upstream sglang (no patch applied) for this test; whatever the session had is restored afterwards."""
    _unpatch(monkeypatch, SCHEDULER_TARGETS + TOKENIZER_TARGETS + ENGINE_TARGETS)
    monkeypatch.setattr(engine_mod, "run_scheduler_process", scheduler_mod.run_scheduler_process)
    for var in (ENV_TOP_K, ENV_MODE, ENV_ALLOW_UNSUPPORTED):
        monkeypatch.setenv(var, "")  # records the prior value (or its absence) for teardown
        monkeypatch.delenv(var)


@pytest.fixture
def patched(pristine) -> None:
    """Scheduler-process and TokenizerManager patches applied (full vocabulary, raw); undone after the test."""
    sp.apply_scheduler_patches(EntropyConfig())
    tp.apply_tokenizer_patches()


@pytest.fixture
def tp_group(monkeypatch) -> None:
    """The tensor-parallel group the real ``Sampler.__init__`` reads (only ``device_group`` is used, for TP sync)."""
    monkeypatch.setattr(parallel_state, "_TP", SimpleNamespace(device_group=None))


class CaptureSocket:
    """Stands in for the zmq PUSH socket inside sglang's ``SenderWrapper``: keeps every object sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_pyobj(self, obj: Any) -> None:
        self.sent.append(obj)


class TreeCache:
    """Stands in for the radix cache: the result handlers only tell it about finished/unfinished requests."""

    def __init__(self) -> None:
        self.finished: list[str] = []

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        self.finished.append(req.rid)

    def cache_unfinished_req(self, req: Req, chunked: bool = False) -> None:
        pass


def _bind(obj: Any, cls: type, *names: str) -> None:
    """Bind ``cls``'s real (possibly patched) methods onto the stand-in ``obj``."""
    for name in names:
        setattr(obj, name, types.MethodType(getattr(cls, name), obj))


def make_scheduler(server_args: ServerArgs, overlap: bool) -> SimpleNamespace:
    """A stand-in ``self`` for the real Scheduler methods, with senders made by the real (patched) ``init_sockets``.

    ``pp_rank=1`` makes ``init_sockets`` build socketless ``SenderWrapper``s (its non-first-rank branch); each gets a
    :class:`CaptureSocket` afterwards, so outputs go through the real ``SenderWrapper.send_output`` and our wrapper.
    """
    sched = SimpleNamespace(
        is_generation=True,
        enable_overlap=overlap,
        server_args=server_args,
        model_config=SimpleNamespace(is_multimodal_gen=False, vocab_size=VOCAB),
        tree_cache=TreeCache(),
        token_to_kv_pool_allocator=SimpleNamespace(free_group_begin=lambda: None, free_group_end=lambda: None),
        num_generated_tokens=0,
        forward_ct_decode=0,
        current_scheduler_metrics_enabled=lambda: False,
        stream_interval=1,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        disaggregation_mode=DisaggregationMode.NULL,
        enable_hicache_storage=False,
        attn_tp_rank=0,
        pp_rank=1,
        waiting_queue=[],
        grammar_queue=[],
        running_batch=ScheduleBatch(reqs=[]),
        cur_batch=None,
    )
    _bind(
        sched,
        Scheduler,
        "stream_output",
        "stream_output_generation",
        "add_logprob_return_values",
        "add_input_logprob_return_values",
        "_initialize_empty_logprob_containers",
        "_calculate_num_input_logprobs",
        "_is_multi_item_scoring",
        "abort_request",
    )
    Scheduler.init_sockets(sched, server_args, None)
    sched.detokenizer_socket = sched.send_to_detokenizer.socket = CaptureSocket()
    sched.tokenizer_socket = sched.send_to_tokenizer.socket = CaptureSocket()
    return sched


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


# ----------------------------------------------------------------------------------------------------------------
# 1. The real Sampler subclass
# ----------------------------------------------------------------------------------------------------------------

CONFIGS = {
    "raw": EntropyConfig(),
    "tempered": EntropyConfig(mode="tempered"),
    "top_k": EntropyConfig(top_k=5),
}
# Per-row sampling parameters of one batch: sglang builds SamplingBatchInfo from them (temperature 0 = greedy).
PATHS = {
    "greedy": [dict(temperature=0.0)] * 4,
    "temperature": [dict(temperature=t) for t in (0.7, 1.3, 0.5, 1.0)],
    "top_k_top_p": [
        dict(temperature=0.7, top_k=8, top_p=0.9),
        dict(temperature=1.3, top_k=4),
        dict(temperature=0.5, top_p=0.8),
        dict(temperature=0.0),  # a greedy row inside a sampling batch
    ],
}


def sampling_info(rows: list[dict]) -> SamplingBatchInfo:
    """sglang's own ``SamplingBatchInfo.from_schedule_batch`` over real Reqs with these sampling parameters."""
    reqs = [make_req(f"r{i}", 8, stream=False, **row) for i, row in enumerate(rows)]
    return SamplingBatchInfo.from_schedule_batch(ScheduleBatch(reqs=reqs, device="cpu"), VOCAB)


def reference_entropy(logits: torch.Tensor, temperatures: torch.Tensor, config: EntropyConfig) -> torch.Tensor:
    """Independent float64 entropy of the distribution the config names (sorted top-k, explicit -sum p log p)."""
    x = logits.double()
    if config.mode == "tempered":
        x = x / temperatures.double()
    if config.top_k:
        x = x.sort(dim=-1, descending=True).values[:, : config.top_k]
    p = torch.softmax(x, dim=-1)
    return -(p * p.log()).sum(-1)


def run_sampler(
    sampler: torch.nn.Module, logits: torch.Tensor, rows: list[dict], return_logprob: bool = True, seed: int = 1234
):
    """One real ``forward`` on a clone of ``logits`` under ``seed``; returns (ids, LogitsProcessorOutput)."""
    bs = logits.shape[0]
    out = LogitsProcessorOutput(next_token_logits=logits.clone())
    torch.manual_seed(seed)
    ids = sampler(out, sampling_info(rows), return_logprob, [0] * bs, [None] * bs, torch.arange(bs))
    return ids, out


@pytest.fixture
def logits() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, VOCAB, generator=generator) * 2.5


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_sampler_records_entropy_of_the_logits_before_forward_mutates_them(
    pristine, tp_group, logits, config_name, path
):
    config, rows = CONFIGS[config_name], PATHS[path]
    upstream = sampler_mod.Sampler
    sp.apply_scheduler_patches(config)
    entropy_sampler_cls = sampler_mod.Sampler
    assert entropy_sampler_cls.__bases__ == (upstream,) and model_runner_mod.Sampler is entropy_sampler_cls
    assert entropy_sampler_cls.entropy_config == config

    ids, out = run_sampler(entropy_sampler_cls(), logits, rows)
    ref_ids, ref_out = run_sampler(upstream(), logits, rows)

    temperatures = sampling_info(rows).temperatures
    expected_input = logits.clone() / temperatures if config.mode == "tempered" else logits.clone()
    expected = compute_entropy(expected_input, config.top_k)
    entropy = getattr(out, sp.ENTROPY_ATTR)
    assert entropy.dtype == torch.float32 and entropy.shape == (4,)
    torch.testing.assert_close(entropy, expected, rtol=0, atol=0)
    torch.testing.assert_close(entropy.double(), reference_entropy(logits, temperatures, config), rtol=0, atol=1e-5)

    # Sampling is untouched: same ids and logprobs as the unpatched Sampler under the same seed (which matters:
    # other seeds draw other ids on the sampling paths).
    assert ids.tolist() == ref_ids.tolist()
    other_seeds = {tuple(run_sampler(upstream(), logits, rows, seed=s)[0].tolist()) for s in range(5)}
    assert (other_seeds == {tuple(ids.tolist())}) == (path == "greedy")
    assert out.next_token_logprobs is not None
    torch.testing.assert_close(out.next_token_logprobs, ref_out.next_token_logprobs, rtol=0, atol=0)
    tempered_logprobs = torch.log_softmax(logits / temperatures, dim=-1)[torch.arange(4), ids.long()]
    torch.testing.assert_close(out.next_token_logprobs, tempered_logprobs, rtol=0, atol=1e-5)

    mutated = out.next_token_logits
    if path == "greedy":
        assert torch.equal(mutated, logits)  # argmax path leaves the logits alone
    else:
        # forward turned the logits into probabilities in place: entropy computed afterwards would be wrong
        assert not torch.equal(mutated, logits)
        torch.testing.assert_close(mutated.sum(-1), torch.ones(4))
        assert not torch.allclose(compute_entropy(mutated, config.top_k), expected, atol=1e-3)


def test_tempered_and_raw_entropy_differ_at_temperature_not_one(pristine, tp_group, logits):
    rows = PATHS["temperature"]
    values = {}
    for name in ("raw", "tempered"):
        sp.apply_scheduler_patches(CONFIGS[name])
        values[name] = getattr(run_sampler(sampler_mod.Sampler(), logits, rows)[1], sp.ENTROPY_ATTR)
    # rows 0-2 have T != 1 (tempering changes the distribution), row 3 has T == 1
    assert (values["raw"][:3] - values["tempered"][:3]).abs().min() > 0.05
    torch.testing.assert_close(values["raw"][3], values["tempered"][3])


def test_sampler_computes_no_entropy_without_logprobs(pristine, tp_group, logits, monkeypatch):
    sp.apply_scheduler_patches(EntropyConfig())

    def must_not_run(*args, **kwargs):
        raise AssertionError("entropy computed for a batch without return_logprob")

    monkeypatch.setattr(sp, "entropy_for_sampling", must_not_run)
    rows = PATHS["top_k_top_p"]
    ids, out = run_sampler(sampler_mod.Sampler(), logits, rows, return_logprob=False)
    ref_ids, _ = run_sampler(original_of(sampler_mod.Sampler)(), logits, rows, return_logprob=False)
    assert getattr(out, sp.ENTROPY_ATTR, None) is None and out.next_token_logprobs is None
    assert ids.tolist() == ref_ids.tolist()


# ----------------------------------------------------------------------------------------------------------------
# 2. The real scheduler result processing over many steps
# ----------------------------------------------------------------------------------------------------------------


def token_value(req_index: int, position: int) -> float:
    """The entropy fed for the token at ``position`` of request ``req_index``: exact in float32, unique, > 0."""
    return 0.25 + req_index + position / 64


SENTINEL = -7.0  # fed for rows that must not get a value (no real entropy is negative)


@dataclasses.dataclass
class Sent:
    """One request's slice of one ``BatchTokenIDOutput``."""

    output_ids: list[int]
    logprobs: list[float] | None
    entropy: list[float]
    finish: dict | None


class SchedulerRun:
    """Feeds batches to the real (patched) result handlers the way sglang's event loops do.

    Each step builds a real ``ScheduleBatch`` and a ``GenerationBatchResult`` whose ``logits_output`` carries
    ``next_token_entropy`` (what ``EntropySampler`` attaches) and ``next_token_logprobs``. A live row of request
    ``k`` about to get its token number ``t`` is fed ``token_value(k, t)`` as entropy and its negation as logprob;
    rows that get no token (a chunk that is not the last; under overlap, a request finished or retracted after the
    batch was launched) are fed
    :data:`SENTINEL`. With overlap, the next batch is formed *before* the current result is processed, as in
    ``event_loop_overlap``: requests finishing in this step come back once more as finished rows.
    """

    def __init__(self, scheduler: SimpleNamespace, reqs: list[Req]) -> None:
        self.scheduler = scheduler
        self.index = {req.rid: k for k, req in enumerate(reqs)}
        self.overlap = scheduler.enable_overlap
        self.steps = 0

    def _token(self, req: Req, position: int) -> int:
        if req.rid == "eos" and position == 2:
            return EOS
        return 10 + (7 * self.index[req.rid] + position) % 50

    def _result(self, reqs: list[Req]) -> GenerationBatchResult:
        ids, entropy = [], []
        for req in reqs:
            live = not (req.finished() or req.is_retracted) and req.is_chunked == 0
            position = len(req.output_ids)
            ids.append(self._token(req, position) if live else 0)
            entropy.append(token_value(self.index[req.rid], position) if live else SENTINEL)
        output = LogitsProcessorOutput(
            next_token_logits=None, next_token_logprobs=-torch.tensor(entropy, dtype=torch.float32)
        )
        setattr(output, sp.ENTROPY_ATTR, torch.tensor(entropy, dtype=torch.float32))
        prompt_lens = [len(req.origin_input_ids) for req in reqs]
        return GenerationBatchResult(
            logits_output=output,
            next_token_ids=torch.tensor(ids, dtype=torch.int64),
            # logprob start == input length: output logprobs only (sglang's default logprob_start_len)
            extend_input_len_per_req=prompt_lens,
            extend_logprob_start_len_per_req=prompt_lens,
            copy_done=SimpleNamespace(synchronize=lambda: None) if self.overlap else None,
        )

    def _step(self, handler: Callable, reqs: list[Req]) -> list[Req]:
        self.steps += 1
        goes_on = [r for r in reqs if r.is_chunked == 0]  # a chunked request continues in a later prefill
        launched_next = [r for r in goes_on if not r.finished()]
        batch = ScheduleBatch(reqs=list(reqs), return_logprob=True, spec_algorithm=SpeculativeAlgorithm.NONE)
        batch.enable_overlap = self.overlap
        handler(self.scheduler, batch, self._result(reqs))
        return launched_next if self.overlap else [r for r in goes_on if not r.finished()]

    def prefill(self, reqs: list[Req]) -> list[Req]:
        return self._step(Scheduler.process_batch_result_prefill, reqs)

    def decode(self, reqs: list[Req]) -> list[Req]:
        return self._step(Scheduler.process_batch_result_decode, reqs)


def sends_by_rid(outputs: list[Any]) -> dict[str, list[Sent]]:
    """Split the captured ``BatchTokenIDOutput``s into per-request slices, checking each batch's shape."""
    sends: dict[str, list[Sent]] = {}
    for out in outputs:
        assert isinstance(out, BatchTokenIDOutput)
        assert len(out.output_token_entropy_val) == len(out.rids)
        for i, rid in enumerate(out.rids):
            sends.setdefault(rid, []).append(
                Sent(
                    out.output_ids[i],
                    out.output_token_logprobs_val[i] if out.output_token_logprobs_val is not None else None,
                    out.output_token_entropy_val[i],
                    out.finished_reasons[i],
                )
            )
    return sends


@dataclasses.dataclass
class Scenario:
    reqs: dict[str, Req]
    outputs: list[BatchTokenIDOutput]
    scheduler: SimpleNamespace
    store_after_first_prefill: dict[str, bool]


# rid -> sizes of its successive sends (same with overlap on and off: overlap only adds skipped rows)
EXPECTED_SEND_SIZES = {
    "stream1": [1, 1, 1, 1],  # stream, stream_interval 1: every token; length finish at 4
    "stream3": [1, 3, 3],  # stream, stream_interval 3: at 1 and 4 tokens, then the finish at 7
    "nonstream": [50, 3],  # non-stream: every DEFAULT_FORCE_STREAM_INTERVAL (50) tokens and at the finish
    "chunked": [1, 1, 1],  # first chunk: nothing; last chunk gives token 1; then decode
    "eos": [3],  # non-stream, stops on EOS at its 3rd token
    "aborted": [1, 1, 1],  # stream, aborted by the real abort_request after 2 tokens: the 3rd step finishes it
    "onetoken": [1],  # max_new_tokens=1: finishes in prefill
    "nologprob": [1, 1, 1, 1],  # return_logprob=False in a logprob batch: empty entropy and logprob slices
}
EXPECTED_FINISH = {
    "stream1": "length",
    "stream3": "length",
    "nonstream": "length",
    "chunked": "length",
    "eos": "stop",
    "aborted": "abort",
    "onetoken": "length",
    "nologprob": "length",
}


def run_scenario(server_args: ServerArgs, overlap: bool) -> Scenario:
    """Drive eight requests (stream / non-stream / chunked / EOS / abort / ...) to completion through the real code."""
    assert mixin_mod.DEFAULT_FORCE_STREAM_INTERVAL == 50
    scheduler = make_scheduler(server_args, overlap)
    reqs = [
        make_req("stream1", 4, stream=True),
        make_req("stream3", 7, stream=True, stream_interval=3),
        make_req("nonstream", 53, stream=False),
        make_req("chunked", 3, stream=True, prompt_len=12),
        make_req("eos", 10, stream=False, eos=EOS),
        make_req("aborted", 10, stream=True),
        make_req("onetoken", 1, stream=True),
        make_req("nologprob", 4, stream=True, return_logprob=False),
    ]
    by_rid = {req.rid: req for req in reqs}
    run = SchedulerRun(scheduler, reqs)
    store = sp.scheduler_store(scheduler)

    by_rid["chunked"].is_chunked = 1  # its prompt does not fit in this prefill: first chunk only
    running = run.prefill(reqs)
    store_after_first_prefill = {rid: rid in store for rid in by_rid}
    running = run.decode(running)
    running += run.prefill([by_rid["chunked"]])  # last chunk: its first token
    while running:
        assert run.steps < 80, "scenario does not terminate"
        aborted = by_rid["aborted"]
        if len(aborted.output_ids) == 2 and not aborted.finished() and aborted.to_finish is None:
            scheduler.running_batch = ScheduleBatch(reqs=list(running))
            Scheduler.abort_request(scheduler, AbortReq(rid="aborted"))
            assert aborted.to_finish is not None  # the real abort of a running request: finish at next step
        running = run.decode(running)
    return Scenario(by_rid, list(scheduler.detokenizer_socket.sent), scheduler, store_after_first_prefill)


@pytest.fixture(params=[False, True], ids=["sync", "overlap"])
def scenario(request, patched, server_args) -> Scenario:
    return run_scenario(server_args, overlap=request.param)


def test_outgoing_entropy_slices_are_exactly_the_new_values(scenario: Scenario):
    sends = sends_by_rid(scenario.outputs)
    assert set(sends) == set(EXPECTED_SEND_SIZES)
    for rid, req in scenario.reqs.items():
        k = list(scenario.reqs).index(rid)
        got = sends[rid]
        assert [len(s.output_ids) for s in got] == EXPECTED_SEND_SIZES[rid], rid
        assert [s.finish is not None for s in got] == [False] * (len(got) - 1) + [True], rid
        assert got[-1].finish["type"] == EXPECTED_FINISH[rid], (rid, got[-1].finish)
        assert sum((s.output_ids for s in got), []) == req.output_ids_through_stop, rid
        if not req.return_logprob:
            assert all(s.entropy == [] and s.logprobs == [] for s in got), rid
            continue
        start = 0
        for s in got:  # each slice: the values of exactly the tokens in this send, aligned with their logprobs
            end = start + len(s.output_ids)
            assert s.entropy == [token_value(k, t) for t in range(start, end)], (rid, start)
            assert s.logprobs == [-token_value(k, t) for t in range(start, end)], (rid, start)
            start = end
        assert start == len(req.output_ids_through_stop) == len(req.output_token_logprobs_val)


def test_rows_without_a_token_record_nothing(scenario: Scenario):
    sent_values = [v for out in scenario.outputs for values in out.output_token_entropy_val for v in values]
    assert SENTINEL not in sent_values and all(v > 0 for v in sent_values)
    # after the first prefill: the chunked request (no token yet) and the no-logprob one hold nothing, the
    # one-token request already finished and was cleaned up when its finished output was sent
    assert scenario.store_after_first_prefill == {
        "stream1": True,
        "stream3": True,
        "nonstream": True,
        "chunked": False,
        "eos": True,
        "aborted": True,
        "onetoken": False,
        "nologprob": False,
    }
    first_rids = scenario.outputs[0].rids
    assert "chunked" not in first_rids and "onetoken" in first_rids


def test_store_is_empty_once_every_request_finished(scenario: Scenario):
    assert all(req.finished() for req in scenario.reqs.values())
    assert len(sp.scheduler_store(scenario.scheduler)) == 0
    assert sorted(scenario.scheduler.tree_cache.finished) == sorted(scenario.reqs)  # each released exactly once


def test_overlap_rows_finished_or_retracted_since_launch_are_skipped(patched, server_args):
    """Under overlap the batch of step t+1 is launched before step t is processed: it still holds a request that
    finished in step t, and one the scheduler retracted meanwhile. Neither row gets a token, so neither gets entropy;
    the retracted request gets its next value from its re-prefill."""
    scheduler = make_scheduler(server_args, overlap=True)
    reqs = [make_req("short", 2, stream=True), make_req("long", 4, stream=True), make_req("retracted", 4, stream=True)]
    short, long, retracted = reqs
    run = SchedulerRun(scheduler, reqs)
    store = sp.scheduler_store(scheduler)
    running = run.prefill(reqs)
    running = run.decode(running)  # short finishes here ...
    assert short.finished() and running == reqs  # ... but the batch already launched still holds it
    assert "short" not in store
    retracted.reset_for_retract()  # the real retraction (KV pressure), after that batch was launched
    running = run.decode(running)
    assert "short" not in store and len(short.output_ids) == 2  # skipped by sglang and by the entropy hook
    assert len(retracted.output_ids) == 2 and len(long.output_ids) == 3
    running.remove(retracted)  # back to the waiting queue ...
    retracted.is_retracted = False  # ... and re-prefilled (ScheduleBatch.prepare_for_extend clears the flag)
    running += run.prefill([retracted])
    while running:
        running = run.decode(running)
    assert len(store) == 0
    sends = sends_by_rid(scheduler.detokenizer_socket.sent)
    assert sends["short"][-1].entropy == [token_value(0, 1)]
    for k, req in enumerate(reqs):
        got = sends[req.rid]
        # (sglang also streams an empty slice for the retracted row: the entropy slice is empty with it)
        assert all(len(s.entropy) == len(s.logprobs) == len(s.output_ids) for s in got), req.rid
        assert sum((s.entropy for s in got), []) == [token_value(k, t) for t in range(len(req.output_ids))]
        assert sum((s.logprobs for s in got), []) == [-token_value(k, t) for t in range(len(req.output_ids))]


def test_abort_req_through_the_wrapped_sender_cleans_up(patched, server_args):
    """A retracted request waiting for re-prefill holds entropy; the real abort_request sends AbortReq and frees it."""
    scheduler = make_scheduler(server_args, overlap=False)
    store = sp.scheduler_store(scheduler)
    waiting = make_req("waiting", 8, stream=True)
    for value in (0.5, 0.75):
        store.append("waiting", value)
    store.append("other", 1.5)
    scheduler.waiting_queue = [waiting]

    Scheduler.abort_request(scheduler, AbortReq(rid="waiting"))

    assert scheduler.waiting_queue == []
    assert [type(o) for o in scheduler.tokenizer_socket.sent] == [AbortReq]
    assert scheduler.tokenizer_socket.sent[0].rid == "waiting"  # still delivered by the real SenderWrapper
    assert "waiting" not in store and store.get_since_offset("other") == [1.5]
    # the detokenizer-side sender is wrapped the same way
    scheduler.send_to_detokenizer.send_output(AbortReq(rid="other"))
    assert len(store) == 0 and isinstance(scheduler.detokenizer_socket.sent[-1], AbortReq)


def test_internal_state_reports_held_requests(patched, server_args):
    scheduler = make_scheduler(server_args, overlap=False)
    scheduler.__dict__.update(
        last_gen_throughput=0.0,
        max_total_num_tokens=1024,
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(weight_load_mem_usage=0.0, graph_mem_usage=0.0)),
    )
    scheduler.token_to_kv_pool_allocator.get_kvcache = lambda: SimpleNamespace(mem_usage=0.0)
    store = sp.scheduler_store(scheduler)
    store.append("a", 1.0)
    store.append("b", 2.0)
    state = Scheduler.get_internal_state(scheduler, GetInternalStateReq()).internal_state
    assert state[sp.INTERNAL_STATE_KEY] == 2
    store.cleanup("a")
    store.cleanup("b")
    assert Scheduler.get_internal_state(scheduler, GetInternalStateReq()).internal_state[sp.INTERNAL_STATE_KEY] == 0


# ----------------------------------------------------------------------------------------------------------------
# 3. Guards
# ----------------------------------------------------------------------------------------------------------------


def _current(targets: list[tuple[Any, str]]) -> list[Any]:
    return [getattr(owner, name) for owner, name in targets]


def test_apply_scheduler_patches_twice_is_once(pristine):
    upstream = sampler_mod.Sampler
    sp.apply_scheduler_patches(EntropyConfig())
    first = _current(SCHEDULER_TARGETS)
    assert all(is_patched(owner, name) for owner, name in SCHEDULER_TARGETS if owner is Scheduler)
    sp.apply_scheduler_patches(EntropyConfig(top_k=3, mode="tempered"))
    second = _current(SCHEDULER_TARGETS)
    assert all(a is b for a, b in zip(first, second, strict=True))
    entropy_sampler_cls = sampler_mod.Sampler
    assert entropy_sampler_cls.__bases__ == (upstream,)  # subclassed once, not a subclass of a subclass
    assert [c.__name__ for c in entropy_sampler_cls.__mro__].count("EntropySampler") == 1
    assert entropy_sampler_cls.entropy_config == EntropyConfig(top_k=3, mode="tempered")  # the latest config
    assert (
        original_of(Scheduler.process_batch_result_decode)
        is mixin_mod.SchedulerOutputProcessorMixin.__dict__["process_batch_result_decode"]
    )


def test_check_signature_names_the_supported_version():
    def process_batch_result_decode(self, batch, result, extra=None):
        pass

    with pytest.raises(UnsupportedSGLangError, match=r"0\.5\.6\.post2") as info:
        check_signature(process_batch_result_decode, ("self", "batch", "result"), "process_batch_result_decode")
    assert "process_batch_result_decode" in str(info.value) and "extra" in str(info.value)
    check_signature(process_batch_result_decode, ("self", "batch", "result", "extra"), "ok")  # exact match passes


def test_changed_upstream_signature_refuses_before_patching_anything(pristine, monkeypatch):
    def process_batch_result_decode(self, batch, result, extra=None):
        pass

    monkeypatch.setattr(
        mixin_mod.SchedulerOutputProcessorMixin, "process_batch_result_decode", process_batch_result_decode
    )
    before = _current(SCHEDULER_TARGETS)
    with pytest.raises(UnsupportedSGLangError, match=r"process_batch_result_decode.*0\.5\.6\.post2"):
        sp.apply_scheduler_patches(EntropyConfig())
    assert all(a is b for a, b in zip(before, _current(SCHEDULER_TARGETS), strict=True))


def test_check_sglang_version(pristine, monkeypatch):
    assert check_sglang_version() == SUPPORTED == sglang.__version__
    monkeypatch.setattr(sglang, "__version__", "0.5.7")
    with pytest.raises(UnsupportedSGLangError, match=r"0\.5\.6\.post2.*found 0\.5\.7") as info:
        check_sglang_version()
    assert ENV_ALLOW_UNSUPPORTED in str(info.value)
    before = _current(SCHEDULER_TARGETS + TOKENIZER_TARGETS + ENGINE_TARGETS)
    with pytest.raises(UnsupportedSGLangError):
        sp.apply_scheduler_patches(EntropyConfig())
    with pytest.raises(UnsupportedSGLangError):
        tt_engine.install()
    after = _current(SCHEDULER_TARGETS + TOKENIZER_TARGETS + ENGINE_TARGETS)
    assert all(a is b for a, b in zip(before, after, strict=True))
    monkeypatch.setenv(ENV_ALLOW_UNSUPPORTED, "1")
    assert check_sglang_version() == "0.5.7"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dp_size", 2, "dp_size > 1"),
        ("speculative_algorithm", "EAGLE", "speculative decoding"),
        ("pp_size", 2, "pp_size > 1"),
        ("disaggregation_mode", "prefill", "disaggregated"),
    ],
)
def test_check_server_args_refuses_unsupported_layouts(pristine, server_args, field, value, message):
    sp.check_server_args(server_args)  # the CPU defaults are fine
    bad = copy.copy(server_args)
    setattr(bad, field, value)
    with pytest.raises(UnsupportedSGLangError, match=f"does not support: {message}"):
        sp.check_server_args(bad)
    before = _current(SCHEDULER_TARGETS)
    with pytest.raises(UnsupportedSGLangError, match=message):
        sp.apply_scheduler_patches(EntropyConfig(), bad)
    assert all(a is b for a, b in zip(before, _current(SCHEDULER_TARGETS), strict=True))  # refused before patching


def test_install_is_idempotent_and_wires_the_scheduler_entry_point(pristine):
    config = tt_engine.install(top_k=0, mode="raw")
    assert config == EntropyConfig()
    assert engine_mod.run_scheduler_process is custom_run_scheduler_process and tt_engine.is_installed()
    first = _current(ENGINE_TARGETS + TOKENIZER_TARGETS)
    assert all(is_patched(owner, name) for owner, name in TOKENIZER_TARGETS + ENGINE_TARGETS[1:])
    assert (os.environ[ENV_TOP_K], os.environ[ENV_MODE]) == ("0", "raw")

    assert tt_engine.install(top_k=7, mode="tempered") == EntropyConfig(top_k=7, mode="tempered")
    assert all(a is b for a, b in zip(first, _current(ENGINE_TARGETS + TOKENIZER_TARGETS), strict=True))
    assert (os.environ[ENV_TOP_K], os.environ[ENV_MODE]) == ("7", "tempered")  # what the next Engine's scheduler reads
    assert EntropyConfig.from_env() == EntropyConfig(top_k=7, mode="tempered")

    # the injected entry point can replace sglang's: same parameters, and spawn can pickle it by reference
    upstream_params = list(inspect.signature(scheduler_mod.run_scheduler_process).parameters)
    assert list(inspect.signature(custom_run_scheduler_process).parameters) == upstream_params
    assert pickle.loads(pickle.dumps(custom_run_scheduler_process)) is custom_run_scheduler_process


@pytest.mark.parametrize(("kwargs", "match"), [(dict(top_k=-1), "top_k"), (dict(mode="bad"), "mode")])
def test_install_validates_before_patching_anything(pristine, kwargs, match):
    before = _current(ENGINE_TARGETS + TOKENIZER_TARGETS)
    with pytest.raises(ValueError, match=match):
        tt_engine.install(**kwargs)
    assert all(a is b for a, b in zip(before, _current(ENGINE_TARGETS + TOKENIZER_TARGETS), strict=True))
    assert engine_mod.run_scheduler_process is scheduler_mod.run_scheduler_process
    assert ENV_TOP_K not in os.environ and ENV_MODE not in os.environ


def test_wrapped_launch_refuses_dp_before_spawning_anything(pristine, base_server_args, monkeypatch):
    tt_engine.install()

    def upstream_reached(*args, **kwargs):
        raise AssertionError("sglang's _launch_subprocesses started configuring/spawning")

    monkeypatch.setattr(engine_mod, "configure_logger", upstream_reached)
    monkeypatch.setattr(engine_mod, "mp", SimpleNamespace(Process=upstream_reached, Pipe=upstream_reached))
    dp_args = ServerArgs(model_path=base_server_args.model_path, device="cpu", dp_size=2)
    with pytest.raises(UnsupportedSGLangError, match=r"dp_size > 1"):
        engine_mod._launch_subprocesses(dp_args)
    with pytest.raises(AssertionError, match="configuring/spawning"):  # control: supported args do reach upstream
        engine_mod._launch_subprocesses(copy.copy(base_server_args))


# ----------------------------------------------------------------------------------------------------------------
# 4. TokenizerManager (parent process) patches
# ----------------------------------------------------------------------------------------------------------------


def make_tokenizer_manager(server_args: ServerArgs) -> SimpleNamespace:
    """A stand-in ``self`` for the real (patched) TokenizerManager methods that handle outputs."""
    manager = SimpleNamespace(
        server_args=server_args,
        rid_to_state={},
        enable_metrics=False,
        dump_requests_folder=None,
        crash_dump_folder=None,
    )
    _bind(
        manager,
        TokenizerManager,
        "convert_logprob_style",
        "add_logprob_to_meta_info",
        "detokenize_logprob_tokens",
        "detokenize_top_logprobs_tokens",
        "_handle_batch_output",
        "_handle_abort_req",
    )
    return manager


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


def convert(manager: SimpleNamespace, state: ReqState, chunk: BatchStrOutput, index: int) -> dict:
    """Call the patched ``convert_logprob_style`` the way ``_handle_batch_output`` does; returns the meta_info."""
    meta_info: dict = {}
    TokenizerManager.convert_logprob_style(manager, meta_info, state, 0, None, False, chunk, index)
    return meta_info


def test_convert_logprob_style_accumulates_entropy_copies(patched, server_args):
    manager = make_tokenizer_manager(server_args)
    a, b = make_state("a", stream=True), make_state("b", stream=True)
    chunks = [
        str_chunk({"a": ([11], [-0.5], [1.25], None), "b": ([21, 22], [-0.1, -0.2], [0.5, 0.75], None)}),
        str_chunk({"b": ([23], [-0.3], [2.0], None), "a": ([12, 13], [-0.6, -0.7], [1.5, 1.75], None)}),
        str_chunk({"a": ([14], [-0.8], [3.0], {"type": "length", "length": 4})}),
    ]
    metas_a = [convert(manager, a, chunks[0], 0), convert(manager, a, chunks[1], 1), convert(manager, a, chunks[2], 0)]
    metas_b = [convert(manager, b, chunks[0], 1), convert(manager, b, chunks[1], 0)]

    assert [m[tp.META_KEY] for m in metas_a] == [[1.25], [1.25, 1.5, 1.75], [1.25, 1.5, 1.75, 3.0]]
    assert [m[tp.META_KEY] for m in metas_b] == [[0.5, 0.75], [0.5, 0.75, 2.0]]
    for meta in metas_a + metas_b:  # aligned index for index with the logprobs sglang reports
        assert len(meta[tp.META_KEY]) == len(meta["output_token_logprobs"])
    assert [t for _, t, _ in metas_a[-1]["output_token_logprobs"]] == [11, 12, 13, 14]
    # each meta_info holds its own list: later chunks did not grow the earlier ones
    assert metas_a[0][tp.META_KEY] is not metas_a[1][tp.META_KEY]
    assert metas_a[0][tp.META_KEY] is not getattr(a, tp.STATE_ATTR)


def test_convert_skips_batches_without_logprobs(patched, server_args):
    manager = make_tokenizer_manager(server_args)
    state = make_state("a")
    chunk = str_chunk({"a": ([11], [-0.5], [1.25], None)})
    chunk.input_token_logprobs_val = None  # no request of the scheduler batch wanted logprobs
    assert convert(manager, state, chunk, 0) == {}
    assert getattr(state, tp.STATE_ATTR, None) is None


def test_request_without_tokens_gets_empty_entropy(patched, server_args):
    """Aborted while waiting: ``add_logprob_to_meta_info`` runs directly on a state that never got a chunk."""
    manager = make_tokenizer_manager(server_args)
    meta_info: dict = {}
    TokenizerManager.add_logprob_to_meta_info(manager, meta_info, make_state("w"), 0, None, False)
    assert meta_info[tp.META_KEY] == [] and meta_info["output_token_logprobs"] == []

    # the same through sglang's own abort handler
    state = make_state("w2", stream=True)
    manager.rid_to_state["w2"] = state
    TokenizerManager._handle_abort_req(manager, AbortReq(rid="w2"))
    (out,) = state.out_list
    assert out["meta_info"][tp.META_KEY] == [] and out["meta_info"]["finish_reason"]["type"] == "abort"


def test_aborted_after_tokens_keeps_what_was_received(patched, server_args):
    manager = make_tokenizer_manager(server_args)
    state = make_state("r", stream=True)
    manager.rid_to_state["r"] = state
    TokenizerManager._handle_batch_output(manager, str_chunk({"r": ([11, 12], [-0.5, -0.6], [1.0, 2.0], None)}))
    TokenizerManager._handle_abort_req(manager, AbortReq(rid="r"))
    meta = state.out_list[-1]["meta_info"]
    assert meta[tp.META_KEY] == [1.0, 2.0] and len(meta["output_token_logprobs"]) == 2


@pytest.fixture
def detokenizer(tiny_model_dir) -> SimpleNamespace:
    """A stand-in ``self`` for the real ``DetokenizerManager`` output path, with the tiny model's tokenizer."""
    from transformers import AutoTokenizer

    manager = SimpleNamespace(
        tokenizer=AutoTokenizer.from_pretrained(str(tiny_model_dir)),
        decode_status=LimitedCapacityDict(capacity=64),
        is_dummy=False,
        is_tool_call_parser_gpt_oss=False,
        disable_tokenizer_batch_decode=False,
    )
    _bind(
        manager, DetokenizerManager, "trim_matched_stop", "_decode_batch_token_id_output", "handle_batch_token_id_out"
    )
    return manager


def test_scheduler_to_meta_info_pipeline(scenario: Scenario, detokenizer, server_args):
    """Scheduler outputs -> real detokenizer -> real (patched) TokenizerManager: meta_info per request."""
    manager = make_tokenizer_manager(server_args)
    states = {
        rid: make_state(rid, stream=req.stream, return_logprob=req.return_logprob) for rid, req in scenario.reqs.items()
    }
    manager.rid_to_state.update(states)
    for out in scenario.outputs:
        TokenizerManager._handle_batch_output(manager, detokenizer.handle_batch_token_id_out(out))
    assert manager.rid_to_state == {}  # every request finished on the tokenizer side too

    for k, (rid, req) in enumerate(scenario.reqs.items()):
        metas = [out["meta_info"] for out in states[rid].out_list]
        final = metas[-1]
        assert final["finish_reason"]["type"] == EXPECTED_FINISH[rid]
        if not req.return_logprob:
            assert tp.META_KEY not in final
            continue
        n = final["completion_tokens"]
        assert final[tp.META_KEY] == [token_value(k, t) for t in range(n)], rid
        assert [lp for lp, _, _ in final["output_token_logprobs"]] == [-v for v in final[tp.META_KEY]]
        # every intermediate meta_info kept the prefix it was built with
        for meta in metas:
            m = meta["completion_tokens"]
            assert meta[tp.META_KEY] == [token_value(k, t) for t in range(m)], (rid, m)
    assert len(states["nonstream"].out_list[-1]["meta_info"][tp.META_KEY]) == 53
