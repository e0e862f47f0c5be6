# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``EntropySampler``: sglang's ``Sampler`` that records the entropy of every step it samples.

Second stop on the entropy's path, inside the scheduler process: the only place where a step's raw logits exist.
``EntropySampler.forward`` computes ``[bs]`` entropies (``entropy.py``) *before* sglang's sampler divides the logits
by temperature and softmaxes them in place, and attaches them to ``logits_output`` as upstream attaches its own
extras. The result handlers (``scheduler_patches.py``) read them from there.
"""

from __future__ import annotations

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.entropy import entropy_for_sampling
from treetune_verl.sglang.support_capture import forward_with_support

# Attribute set on sglang's LogitsProcessorOutput: [bs] float32 entropies (nats), on the logits' device; in mode
# "support" the step's support.StepSupport.
LOGITS_OUTPUT_ENTROPY_ATTR = "next_token_entropy"

# sglang 0.5.6.post2 and 0.5.12 layers/sampler.py Sampler.forward: the signature our wrappers repeat.
SAMPLER_FORWARD_PARAMS = (
    "self",
    "logits_output",
    "sampling_info",
    "return_logprob",
    "top_logprobs_nums",
    "token_ids_logprobs",
    "positions",
)


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
            if return_logprob and self.entropy_config.mode == "support":  # read where sglang samples
                upstream = super().forward
                ids, support = forward_with_support(
                    lambda: upstream(
                        logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions
                    ),
                    logits_output.next_token_logits,
                    sampling_info,
                )
                setattr(logits_output, LOGITS_OUTPUT_ENTROPY_ATTR, support)
                return ids
            if return_logprob:
                entropy = entropy_for_sampling(
                    logits_output.next_token_logits, sampling_info.temperatures, self.entropy_config
                )
                setattr(logits_output, LOGITS_OUTPUT_ENTROPY_ATTR, entropy)
            return super().forward(
                logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions
            )

    EntropySampler.__qualname__ = EntropySampler.__name__ = "EntropySampler"
    return EntropySampler
