# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Inside sglang 0.5.12's scheduler process: every sampled step's entropy (and in mode ``support`` each token's
sampled support, ``support_capture.py``) into sglang's ``customized_info`` channel.

Two wraps. ``Sampler.forward`` records the values; ``Scheduler.get_internal_state`` reports how many requests the
scheduler still holds with values (``INTERNAL_STATE_KEY``, as on 0.5.6.post2: 0 once all have finished or been
aborted). ``Sampler.forward``: sglang copies ``logits_output.customized_info[key][i]`` onto ``batch.reqs[i]``
for each row that gets a token (``scheduler_output_processor_mixin.py`` ``maybe_collect_customized_info``, in both
result handlers, after the step's ``copy_done`` wait), keeps the values on its own ``Req`` (freed with it) and sends
``values[send_token_offset:len(output_ids)]`` with each output, exactly as it slices output ids.

Why every sampled batch gets a value per row, also batches that want no logprobs: sglang builds the per-output
``customized_info[key]`` list only from requests that have one (``stream_output_generation``), while the
TokenizerManager indexes it by the output's row. A request that had never been in a batch with a value would shift
every later row of its output. Batches without logprobs get NaN placeholders (no entropy computed, no device work);
only requests that asked for logprobs ever show their values (``tokenizer_patches``), and those are in a logprob
batch at every step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from treetune_verl.sglang.config import INTERNAL_STATE_KEY, EntropyConfig
from treetune_verl.sglang.entropy import entropy_for_sampling
from treetune_verl.sglang.patching import SGLANG, Wrap
from treetune_verl.sglang.sampler import SAMPLER_FORWARD_PARAMS
from treetune_verl.sglang.support_capture import forward_with_support, install_support_sampling

# Key of our values in sglang's customized_info (LogitsProcessorOutput -> Req -> BatchTokenIDOutput/BatchStrOutput).
CUSTOMIZED_INFO_KEY = "treetune_output_token_entropy"

_INTERNAL_STATE_PARAMS = ("self", "recv_req")  # sglang 0.5.12 managers/scheduler.py Scheduler.get_internal_state
_config = EntropyConfig()


class StepValues(Sequence):
    """One step's per-row values, made on the host at the first read (``make``): one transfer per step.

    sglang reads ``values[i]`` once per row, after waiting for the step's ``copy_done`` event (overlap scheduling),
    so the device tensors are final by then and the copy does not stall the forward thread that computed them.
    Each value is a row's entropy (nats), or in mode ``support`` its ``(entropy, token support)`` pair
    (``support.StepSupport.rows``).
    """

    __slots__ = ("_make", "_values")

    def __init__(self, make: Callable[[], list]):
        self._make: Callable[[], list] | None = make
        self._values: list | None = None

    def _host(self) -> list:
        if self._values is None:
            self._values = self._make()
            self._make = None
        return self._values

    def __getitem__(self, i):
        return self._host()[i]

    def __len__(self) -> int:
        return len(self._host())


def _wrap_forward(original):
    @functools.wraps(original)
    def forward(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions):
        def upstream():
            return original(
                self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions
            )

        logits = logits_output.next_token_logits
        if logits_output.customized_info is None:
            logits_output.customized_info = {}
        if return_logprob and _config.mode == "support":
            ids, support = forward_with_support(upstream, logits, sampling_info)
            logits_output.customized_info[CUSTOMIZED_INFO_KEY] = StepValues(support.rows)
            return ids
        if return_logprob:  # computed before sglang divides by temperature and softmaxes the logits in place
            values = StepValues(entropy_for_sampling(logits, sampling_info.temperatures, _config).tolist)
        else:
            values = [math.nan] * logits.shape[0]
        logits_output.customized_info[CUSTOMIZED_INFO_KEY] = values
        return upstream()

    return forward


def requests_with_entropy(scheduler) -> int:
    """Unfinished requests in the scheduler's queues (waiting, running, being chunked) that carry our values. (A
    finished one can stay in ``running_batch`` until the next step filters it; sglang frees it then.)"""
    queued = [*scheduler.waiting_queue, *scheduler.running_batch.reqs, scheduler.chunked_req]
    reqs = {id(r): r for r in queued if r is not None and not r.finished()}
    return sum(1 for r in reqs.values() if r.customized_info and CUSTOMIZED_INFO_KEY in r.customized_info)


def _wrap_get_internal_state(original):
    @functools.wraps(original)
    def get_internal_state(self, recv_req):
        out = original(self, recv_req)
        out.internal_state[INTERNAL_STATE_KEY] = requests_with_entropy(self)
        return out

    return get_internal_state


def apply_scheduler_hooks(config: EntropyConfig) -> None:
    """Wrap ``Sampler.forward`` and ``Scheduler.get_internal_state`` (idempotent); ``config`` is what later steps
    compute."""
    global _config
    from sglang.srt.layers.sampler import Sampler
    from sglang.srt.managers.scheduler import Scheduler

    SGLANG.wrap(
        Wrap(Sampler, "forward", _wrap_forward, SAMPLER_FORWARD_PARAMS, "Sampler.forward"),
        Wrap(Scheduler, "get_internal_state", _wrap_get_internal_state, _INTERNAL_STATE_PARAMS),
    )
    if config.mode == "support":
        install_support_sampling()
    _config = config
