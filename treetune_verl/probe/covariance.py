# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The covariance estimate of the entropy change of Cui et al. (2025), for comparison with ΔH₁.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (arXiv:2505.22617),
show that for a softmax policy updated by natural policy gradient with logit step size η, the per-state entropy
changes by ≈ -η · Cov_{a~π(·|s)}(log π(a|s), A(s, a)). Their batch estimate, used here, is the covariance over all
response tokens t of the batch between log π(y_t|s_t) and the sequence advantage A broadcast to its tokens:

    ΔH_cov = -lr · mean_t (log π_t - mean log π)(A_t - mean A)      (nats per token)

Caveats: η there is a step in logit space under a tabular/natural-gradient assumption, not the optimizer's lr in
parameter space, and the quantity is a per-token average rather than H_seq / L_max; compare sign and order of
magnitude, not digits.
"""

from __future__ import annotations

import torch

from treetune_verl.probe.components import ProbeComponents


@torch.no_grad()
def covariance_entropy_change(
    components: ProbeComponents, U_batch: dict[str, torch.Tensor], mb_size_prompts: int, lr: float
) -> float:
    """-lr · Cov_t(log π, A) over the response tokens of ``U_batch`` (teacher-forced, fp64 accumulation)."""
    logprobs, advantages = [], []
    for mb, tf in components.teacher_forced_microbatches(U_batch, mb_size_prompts, False, "U_batch"):
        valid = tf.response_mask.cpu()
        adv = mb["advantages"].double().unsqueeze(-1).expand(valid.shape)
        logprobs.append(tf.token_logprobs.double().cpu()[valid])
        advantages.append(adv[valid])
    lp, adv = torch.cat(logprobs), torch.cat(advantages)
    return float(-lr * ((lp - lp.mean()) * (adv - adv.mean())).mean())
