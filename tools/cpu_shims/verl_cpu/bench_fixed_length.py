# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Bench only: every sglang request generates exactly its ``max_new_tokens`` (sglang's own ``ignore_eos``).

Not a CPU fix: applied only when ``TREETUNE_BENCH_FIXED_LENGTH=1`` (set by ``bench_e2e_overhead.py --fixed-length``
for both arms alike, never by a training run). Sampling on CPU does not repeat from run to run (the scheduler forms
its batches by arrival time, and ``torch.multinomial`` draws from one generator across the batch), so a block run and
a stock run of the same step generate responses of different lengths, and their ``timing_s/gen`` and
``timing_s/update_actor`` time different amounts of work (up to 2x in a pair on SmolLM2). With EOS ignored, every
response of both arms is ``response_length`` tokens long: the arms do the same work and the ratio measures the block.

Upstream: ``sglang/srt/sampling/sampling_params.py:SamplingParams.__init__`` stores ``ignore_eos``;
``sglang/srt/managers/schedule_batch.py:Req._check_token_based_finish`` then never finishes on an EOS token, so the
request ends at ``max_new_tokens``. ``SamplingParams`` is built from the request's dict in the TokenizerManager
(verl's server actor), which this patch reaches through the import hook like every other.
"""

from __future__ import annotations

from types import ModuleType

from verl_cpu._guard import is_patched, replacement_of, require_cpu_only, require_signature, require_versions

PATCH = "bench_fixed_length"
SUPPORTED = {"sglang": ("0.5.6.post2", "0.5.12")}
INIT_PARAMETERS = (
    "self", "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "custom_params", "stream_interval", "logit_bias", "sampling_seed",
)  # fmt: skip


def apply(sampling_params: ModuleType) -> None:
    params = sampling_params.SamplingParams
    if is_patched(params.__init__):
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    require_signature(
        PATCH, params.__init__, INIT_PARAMETERS, "sglang/srt/sampling/sampling_params.py:SamplingParams.__init__"
    )
    original = params.__init__

    @replacement_of(original, PATCH)
    def __init__(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        self.ignore_eos = True

    params.__init__ = __init__
