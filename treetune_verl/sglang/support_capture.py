# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Mode ``support``: the support each token was sampled from, captured around sglang's ``Sampler.forward`` (issue 48).

Both versions' sampler hooks call :func:`forward_with_support` where the other modes call the entropy formula. What
it reads depends on the path sglang's ``Sampler.forward`` takes for the step (layers/sampler.py, both versions):

- some row truncates (``need_top_k/top_p/min_p_sampling``): sglang calls its module's
  ``top_k_top_p_min_p_sampling_from_probs_torch`` by name. :func:`install_support_sampling` binds that name to our
  copy of the function (``support_sampling.py``, refused unless upstream's source is the one copied), which samples
  as upstream does and leaves the weights it drew from for this step's reader (``_step``);
- no row truncates: sglang draws from softmax(logits / T), the whole tempered distribution (size V, mass 1, no ids),
  its entropy and the sampled token's log-probability read from the log-softmax computed before sglang softmaxes the
  logits in place;
- every row greedy: the argmax, a support of one token.

sglang settings under which it samples elsewhere (flashinfer's kernels, the deterministic log-softmax path, custom
logit processors applied after our read) are refused before an Engine starts (``server_args.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from treetune_verl.sglang.patching import SGLANG, Replace
from treetune_verl.sglang.support import StepSupport, read_support
from treetune_verl.sglang.support_sampling import UPSTREAM, installed_copy, upstream_source_problem


class _StepWeights:
    """What our copy of sglang's sampler drew from in the step being sampled: set only while a support is wanted
    (one forward thread samples at a time), taken and cleared by :func:`forward_with_support`."""

    wanted: bool = False
    weights: torch.Tensor | None = None  # [n, V] sorted, 0 where filtered
    order: torch.Tensor | None = None  # [n, V] int32 token ids

    def take(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        weights, order = self.weights, self.order
        self.wanted, self.weights, self.order = False, None, None
        return weights, order


_step = _StepWeights()


def _make_sampling_with_support(sample_with_support: Callable[..., Any]) -> Callable[..., torch.Tensor]:
    def top_k_top_p_min_p_sampling_from_probs_torch(
        probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions
    ):
        ids, weights, order = sample_with_support(
            probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions
        )
        if _step.wanted:
            _step.weights, _step.order = weights, order
        return ids

    return top_k_top_p_min_p_sampling_from_probs_torch


def install_support_sampling() -> None:
    """Bind sglang's torch sampler's name to our copy (idempotent; refused unless upstream is the copied source)."""
    from sglang.srt.layers import sampler

    copy = installed_copy()
    SGLANG.replace(
        Replace(
            sampler,
            "top_k_top_p_min_p_sampling_from_probs_torch",
            lambda _: _make_sampling_with_support(copy.sample_with_support),
            lambda fn: upstream_source_problem(fn, copy.UPSTREAM_SOURCE_SHA256),
            why="the weights it draws from are its locals: a copy of it (source-hash checked) that also returns them",
            where=UPSTREAM,
        )
    )


def truncates(sampling_info: Any) -> bool:
    """Whether sglang's ``Sampler.forward`` samples this step through its truncating sampler."""
    return not sampling_info.is_all_greedy and bool(
        sampling_info.need_top_p_sampling or sampling_info.need_top_k_sampling or sampling_info.need_min_p_sampling
    )


@torch.no_grad()
def forward_with_support(
    forward: Callable[[], torch.Tensor], logits: torch.Tensor, sampling_info: Any
) -> tuple[torch.Tensor, StepSupport]:
    """Run sglang's ``Sampler.forward`` (``forward``, its arguments bound) and read the step's supports.

    Args:
        forward: upstream's forward of this step; returns the ``[n]`` sampled ids.
        logits: ``[n, V]`` the step's raw logits (``logits_output.next_token_logits``), which ``forward`` overwrites.
        sampling_info: sglang's ``SamplingBatchInfo`` of the step (temperatures ``[n, 1]``, top-k/top-p/min-p ``[n]``).

    Raises:
        RuntimeError: the step truncated but our copy of the sampler did not run (sglang sampled elsewhere).
    """
    truncating = truncates(sampling_info)
    # Not truncating: the support is the tempered distribution, read before forward softmaxes the logits in place.
    logp = None if truncating else torch.log_softmax(logits.float() / sampling_info.temperatures, dim=-1)
    _step.wanted = truncating
    try:
        ids = forward()
    finally:
        weights, order = _step.take()
    if truncating:
        if weights is None:
            raise RuntimeError(
                f"treetune support: a truncating step was sampled without {UPSTREAM} (bound to our copy): sglang "
                "sampled elsewhere (sampling_backend other than pytorch?); no support can be read."
            )
        vocab = weights.shape[-1]
        whole = (sampling_info.top_ks >= vocab) & (sampling_info.top_ps >= 1.0) & (sampling_info.min_ps <= 0.0)
        return ids, read_support(weights, ids, order, whole)
    if sampling_info.is_all_greedy:  # sglang's argmax: one token, the whole (renormalised) mass on it
        sampled = ids.long()
        n = sampled.shape[0]
        return ids, StepSupport(
            sizes=torch.ones(n, dtype=torch.int64, device=sampled.device),
            token_ids=tuple(sampled[i : i + 1] for i in range(n)),
            kept_mass=logp.gather(1, sampled[:, None]).squeeze(1).exp(),
            entropy=torch.zeros(n, device=sampled.device),
            sampled_logprob=torch.zeros(n, device=sampled.device),
        )
    # The whole tempered distribution: nothing dropped (size V, mass 1, no renormalisation), its entropy in the passes
    # of the entropy formula (entropy.py); this path runs at every untruncated step, so nothing more.
    sampled = ids.long()
    n, vocab = logp.shape
    sampled_logprob = logp.gather(1, sampled[:, None]).squeeze(1)
    p = logp.exp()
    return ids, StepSupport(
        sizes=torch.full((n,), vocab, dtype=torch.int64, device=logp.device),
        token_ids=(None,) * n,
        kept_mass=torch.ones(n, device=logp.device),
        entropy=-p.mul_(logp.clamp_(min=torch.finfo(logp.dtype).min)).sum(dim=-1),
        sampled_logprob=sampled_logprob,
    )
