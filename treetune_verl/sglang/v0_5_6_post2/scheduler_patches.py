# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patches applied inside sglang 0.5.6.post2's spawned scheduler process: record, hold and send entropy.

Third stop on the entropy's path (see agent-docs/architecture.md), one batch step:
  1. ``EntropySampler.forward`` (``sampler.py``) attaches ``[bs]`` entropies to ``logits_output``.
  2. Pre-hooks on ``Scheduler.process_batch_result_prefill`` (first token) and ``process_batch_result_decode``
     copy them to the host once (one ``.tolist()`` per step) and append one value per request that sglang is
     about to give a token, skipping exactly the rows sglang skips. They run *before* the original handlers,
     because those stream the output from inside themselves.
  3. The scheduler's senders fill the existing ``BatchTokenIDOutput.output_token_entropy_val`` with the values
     not yet sent (offset tracking, like sglang's logprobs) and drop a request's state once its finished output
     (or its abort) is sent. The detokenizer already copies the field into ``BatchStrOutput``.
"""

from __future__ import annotations

import functools
from typing import Any

from treetune_verl.sglang.config import INTERNAL_STATE_KEY, EntropyConfig
from treetune_verl.sglang.patching import (
    SGLANG,
    Replace,
    Wrap,
    check_sglang_version,
    is_patched,
    original_of,
    replace_attr,
)
from treetune_verl.sglang.sampler import LOGITS_OUTPUT_ENTROPY_ATTR, SAMPLER_FORWARD_PARAMS, make_entropy_sampler
from treetune_verl.sglang.server_args import check_server_args
from treetune_verl.sglang.support import StepSupport
from treetune_verl.sglang.support_capture import install_support_sampling
from treetune_verl.sglang.v0_5_6_post2.store import EntropyStore

STORE_ATTR = "treetune_entropy_store"  # EntropyStore on each Scheduler instance

# Signatures the wrappers below repeat (sglang 0.5.6.post2): managers/scheduler_output_processor_mixin.py
# process_batch_result_{prefill,decode}; managers/scheduler.py Scheduler.init_sockets, Scheduler.get_internal_state
# and the local class SenderWrapper.send_output.
_RESULT_HANDLER_PARAMS = ("self", "batch", "result")
_INIT_SOCKETS_PARAMS = ("self", "server_args", "port_args")
_SEND_OUTPUT_PARAMS = ("self", "output", "recv_obj")
_INTERNAL_STATE_PARAMS = ("self", "recv_req")


def scheduler_store(scheduler: Any) -> EntropyStore:
    """The scheduler's :class:`EntropyStore` (created on first use)."""
    store = getattr(scheduler, STORE_ATTR, None)
    if store is None:
        store = EntropyStore()
        setattr(scheduler, STORE_ATTR, store)
    return store


def _record(scheduler: Any, batch: Any, result: Any, rows: list[int]) -> None:
    """Append this step's entropy of ``batch.reqs[i]`` for each ``i`` in ``rows`` (one host copy per step)."""
    rows = [i for i in rows if batch.reqs[i].return_logprob]
    if not rows:
        return
    if result.copy_done is not None:  # overlap scheduling: wait for the forward stream's step to finish
        result.copy_done.synchronize()
    entropy = getattr(result.logits_output, LOGITS_OUTPUT_ENTROPY_ATTR, None)
    if entropy is None:
        raise RuntimeError(
            "treetune entropy: a batch with return_logprob reached the scheduler without entropy; the sampler "
            "that ran is not the patched one (a model with its own sampler, or speculative decoding?)."
        )
    values = entropy.rows() if isinstance(entropy, StepSupport) else entropy.tolist()
    store = scheduler_store(scheduler)
    for i in rows:
        store.append(batch.reqs[i].rid, values[i])


def _prefill_rows(scheduler: Any, batch: Any) -> list[int]:
    # Mirrors sglang 0.5.6.post2 managers/scheduler_output_processor_mixin.py process_batch_result_prefill, loop over
    # batch.reqs: `if req.finished() or req.is_retracted: continue`, then a token only `if req.is_chunked <= 0`.
    # Prefill-only requests (max_new_tokens == 0, e.g. sglang's internal prefix request for n > 1) generate
    # nothing, so they get no entropy. (A batch made only of them is not sampled at all and gets a dummy token;
    # in a mixed batch sglang samples their row anyway and returns one logprob with completion_tokens == 0.)
    if not scheduler.is_generation:
        return []
    return [
        i
        for i, req in enumerate(batch.reqs)
        if not (req.finished() or req.is_retracted) and req.is_chunked <= 0 and not req.is_prefill_only
    ]


def _decode_rows(scheduler: Any, batch: Any) -> list[int]:
    # Mirrors sglang 0.5.6.post2 managers/scheduler_output_processor_mixin.py process_batch_result_decode, loop over
    # batch.reqs: `if self.enable_overlap and (req.finished() or req.is_retracted): continue` (rows finished or
    # retracted one step ago under overlap scheduling get no token).
    return [
        i for i, req in enumerate(batch.reqs) if not (scheduler.enable_overlap and (req.finished() or req.is_retracted))
    ]


def _pre_hook(original, rows_of):
    @functools.wraps(original)
    def handler(self, batch, result):
        _record(self, batch, result, rows_of(self, batch))
        return original(self, batch, result)

    return handler


def wrap_sender(sender: Any, store: EntropyStore) -> None:
    """Wrap one scheduler ``SenderWrapper`` instance so its outputs carry entropy and release finished state."""
    from sglang.srt.managers.io_struct import AbortReq, BatchTokenIDOutput

    if is_patched(sender, "send_output"):
        return
    SGLANG.check_signature(type(sender).send_output, _SEND_OUTPUT_PARAMS, "scheduler SenderWrapper.send_output")

    def make(original):
        def send_output(output, recv_obj=None):
            if isinstance(output, BatchTokenIDOutput):
                output.output_token_entropy_val = [store.get_since_offset(rid) for rid in output.rids]
                for rid, finished_reason in zip(output.rids, output.finished_reasons, strict=True):
                    if finished_reason is not None:
                        store.cleanup(rid)
            elif isinstance(output, AbortReq) and output.rid is not None:
                store.cleanup(output.rid)
            return original(output, recv_obj)

        return send_output

    replace_attr(sender, "send_output", make)


def _wrap_init_sockets(original):
    @functools.wraps(original)
    def init_sockets(self, server_args, port_args):
        out = original(self, server_args, port_args)
        store = scheduler_store(self)
        wrap_sender(self.send_to_detokenizer, store)
        wrap_sender(self.send_to_tokenizer, store)
        return out

    return init_sockets


def _wrap_get_internal_state(original):
    @functools.wraps(original)
    def get_internal_state(self, recv_req):
        out = original(self, recv_req)
        out.internal_state[INTERNAL_STATE_KEY] = len(scheduler_store(self))
        return out

    return get_internal_state


def apply_scheduler_patches(config: EntropyConfig, server_args: Any = None) -> None:
    """Apply every scheduler-process patch (idempotent). Call before the Scheduler/ModelRunner are built."""
    check_sglang_version()
    if server_args is not None:
        check_server_args(server_args)

    from sglang.srt.layers import sampler as sampler_mod
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor import model_runner as model_runner_mod

    # The Sampler is looked up by name in model_runner when ModelRunner.initialize() runs; patch both names.
    SGLANG.wrap(
        Wrap(sampler_mod, "Sampler", make_entropy_sampler, SAMPLER_FORWARD_PARAMS, "Sampler.forward", _forward_of),
        Wrap(Scheduler, "process_batch_result_prefill", _prefill_pre_hook, _RESULT_HANDLER_PARAMS),
        Wrap(Scheduler, "process_batch_result_decode", _decode_pre_hook, _RESULT_HANDLER_PARAMS),
        Wrap(Scheduler, "init_sockets", _wrap_init_sockets, _INIT_SOCKETS_PARAMS, "Scheduler.init_sockets"),
        Wrap(Scheduler, "get_internal_state", _wrap_get_internal_state, _INTERNAL_STATE_PARAMS),
    )
    SGLANG.replace(
        Replace(
            model_runner_mod,
            "Sampler",
            lambda _: sampler_mod.Sampler,
            _is_the_samplers_upstream,
            why="model_runner's second name of layers/sampler.py's Sampler, bound to the class wrapped above",
            where="model_runner.Sampler",
        )
    )
    if config.mode == "support":
        install_support_sampling()
    sampler_mod.Sampler.entropy_config = config


def _is_the_samplers_upstream(bound: Any) -> str | None:
    from sglang.srt.layers import sampler as sampler_mod

    upstream = original_of(sampler_mod.Sampler)
    return None if bound is upstream else f"is {bound!r}, not layers/sampler.py's {upstream!r}"


def _forward_of(sampler_class: Any) -> Any:
    return sampler_class.forward


def _prefill_pre_hook(original):
    return _pre_hook(original, _prefill_rows)


def _decode_pre_hook(original):
    return _pre_hook(original, _decode_rows)
