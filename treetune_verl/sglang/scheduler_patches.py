# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patches applied inside sglang 0.5.6.post2's spawned scheduler process (see agent-docs/sglang-engine-guide.md).

Data flow, one batch step:
  1. ``EntropySampler.forward`` computes ``[bs]`` entropies from the raw logits *before* sglang's sampler turns
     them into probabilities in place, and attaches them as ``logits_output.next_token_entropy`` (on the
     logits' device; nothing is copied here).
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

import torch

from treetune_verl.sglang.entropy import EntropyConfig, EntropyStore, compute_entropy
from treetune_verl.sglang.patching import (
    UnsupportedSGLangError,
    check_sglang_version,
    check_signature,
    is_patched,
    original_of,
    replace_attr,
)

ENTROPY_ATTR = "next_token_entropy"  # set on LogitsProcessorOutput by EntropySampler
STORE_ATTR = "treetune_entropy_store"  # EntropyStore on each Scheduler instance

_SAMPLER_FORWARD_PARAMS = (
    "self",
    "logits_output",
    "sampling_info",
    "return_logprob",
    "top_logprobs_nums",
    "token_ids_logprobs",
    "positions",
)
_RESULT_HANDLER_PARAMS = ("self", "batch", "result")
_INIT_SOCKETS_PARAMS = ("self", "server_args", "port_args")
_SEND_OUTPUT_PARAMS = ("self", "output", "recv_obj")
_INTERNAL_STATE_PARAMS = ("self", "recv_req")
# Key added to the scheduler's internal state (Engine.get_server_info()["internal_states"][i]): the number of
# requests whose entropy the scheduler still holds. 0 once every request has finished or been aborted.
INTERNAL_STATE_KEY = "treetune_entropy_requests"


def entropy_for_sampling(
    logits: torch.Tensor, temperatures: torch.Tensor | None, config: EntropyConfig
) -> torch.Tensor:
    """``[bs]`` float32 entropies (nats) of one sampler step, on the logits' device.

    Args:
        logits: ``[bs, V]`` raw next-token logits (after logit bias / grammar mask, before temperature).
        temperatures: ``[bs, 1]`` per-request temperatures (sglang sets 1.0 for greedy requests).
        config: raw = softmax(logits); tempered = softmax(logits / T).
    """
    if config.mode == "tempered":
        logits = logits.float() / temperatures
    return compute_entropy(logits, config.top_k)


def make_entropy_sampler(sampler_cls: type) -> type:
    """Subclass sglang's ``Sampler`` so that ``forward`` records entropy from the untouched logits."""

    class EntropySampler(sampler_cls):
        """sglang ``Sampler`` that also sets ``logits_output.next_token_entropy`` (``[bs]`` float32, nats)."""

        entropy_config: EntropyConfig = EntropyConfig()

        def forward(
            self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions
        ):
            # Entropy is returned with logprobs only, so batches that want none pay nothing. Computed before
            # super().forward, which divides by temperature and softmaxes logits in place.
            if return_logprob:
                entropy = entropy_for_sampling(
                    logits_output.next_token_logits, sampling_info.temperatures, self.entropy_config
                )
                setattr(logits_output, ENTROPY_ATTR, entropy)
            return super().forward(
                logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions
            )

    EntropySampler.__qualname__ = EntropySampler.__name__ = "EntropySampler"
    return EntropySampler


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
    entropy = getattr(result.logits_output, ENTROPY_ATTR, None)
    if entropy is None:
        raise RuntimeError(
            "treetune entropy: a batch with return_logprob reached the scheduler without entropy; the sampler "
            "that ran is not the patched one (a model with its own sampler, or speculative decoding?)."
        )
    values = entropy.tolist()
    store = scheduler_store(scheduler)
    for i in rows:
        store.append(batch.reqs[i].rid, values[i])


def _prefill_rows(scheduler: Any, batch: Any) -> list[int]:
    # Mirrors process_batch_result_prefill: finished/retracted rows and unfinished chunks get no token.
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
    # Mirrors process_batch_result_decode: under overlap, rows finished/retracted one step ago get no token.
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
    check_signature(type(sender).send_output, _SEND_OUTPUT_PARAMS, "scheduler SenderWrapper.send_output")

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


def check_server_args(server_args: Any) -> None:
    """Refuse configurations in which per-token entropy would be missing or misaligned."""
    refusals = {
        "dp_size > 1 (the data-parallel controller starts schedulers with sglang's own run_scheduler_process, "
        "bypassing the injected one)": getattr(server_args, "dp_size", 1) > 1,
        "speculative decoding (several tokens per step, sampled outside the patched Sampler)": getattr(
            server_args, "speculative_algorithm", None
        )
        is not None,
        "pp_size > 1 (pipeline-parallel result processing is not patched)": getattr(server_args, "pp_size", 1) > 1,
        "disaggregated prefill/decode (not patched)": getattr(server_args, "disaggregation_mode", "null") != "null",
    }
    refused = [what for what, bad in refusals.items() if bad]
    if refused:
        raise UnsupportedSGLangError("treetune entropy extraction does not support: " + "; ".join(refused))


def apply_scheduler_patches(config: EntropyConfig, server_args: Any = None) -> None:
    """Apply every scheduler-process patch (idempotent). Call before the Scheduler/ModelRunner are built."""
    check_sglang_version()
    if server_args is not None:
        check_server_args(server_args)

    from sglang.srt.layers import sampler as sampler_mod
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_output_processor_mixin import SchedulerOutputProcessorMixin
    from sglang.srt.model_executor import model_runner as model_runner_mod

    check_signature(original_of(sampler_mod.Sampler).forward, _SAMPLER_FORWARD_PARAMS, "sglang Sampler.forward")
    check_signature(
        SchedulerOutputProcessorMixin.process_batch_result_prefill,
        _RESULT_HANDLER_PARAMS,
        "process_batch_result_prefill",
    )
    check_signature(
        SchedulerOutputProcessorMixin.process_batch_result_decode, _RESULT_HANDLER_PARAMS, "process_batch_result_decode"
    )
    check_signature(Scheduler.init_sockets, _INIT_SOCKETS_PARAMS, "Scheduler.init_sockets")
    check_signature(Scheduler.get_internal_state, _INTERNAL_STATE_PARAMS, "Scheduler.get_internal_state")

    # The Sampler is looked up by name in model_runner when ModelRunner.initialize() runs; patch both names.
    replace_attr(sampler_mod, "Sampler", make_entropy_sampler)
    model_runner_mod.Sampler = sampler_mod.Sampler
    sampler_mod.Sampler.entropy_config = config

    replace_attr(Scheduler, "process_batch_result_prefill", lambda orig: _pre_hook(orig, _prefill_rows))
    replace_attr(Scheduler, "process_batch_result_decode", lambda orig: _pre_hook(orig, _decode_rows))
    replace_attr(Scheduler, "init_sockets", _wrap_init_sockets)
    replace_attr(Scheduler, "get_internal_state", _wrap_get_internal_state)
