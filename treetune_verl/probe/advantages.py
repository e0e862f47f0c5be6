# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Group-relative advantages from per-response rewards.

Shape notation:
    B = prompts, G = responses per prompt

    grpo:    A = (r - mean_g r) / (std_g r + eps)    (std with Bessel's correction, as verl's GRPO)
    dr_grpo: A = r - mean_g r                         (Dr.GRPO: no std normalisation)

A group whose rewards are all equal gets A = 0 exactly under both (never NaN).
"""

from __future__ import annotations

import torch

from treetune_verl.probe.batch import check_group_size


def group_advantages(rewards: torch.Tensor, estimator: str, eps: float = 1e-6) -> torch.Tensor:
    """``[B, G]`` rewards -> ``[B, G]`` fp32 advantages; G >= 2 (the group mean is the baseline)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, G], got shape {list(rewards.shape)}")
    check_group_size(rewards.shape[1], f"advantage.estimator={estimator}", "the group mean as baseline")
    r = rewards.double()
    centred = r - r.mean(dim=1, keepdim=True)
    if estimator == "dr_grpo":
        adv = centred
    elif estimator == "grpo":
        adv = centred / (r.std(dim=1, keepdim=True) + eps)
    else:
        raise ValueError(f"advantage.estimator must be 'grpo' or 'dr_grpo', got {estimator!r}")
    # The fp64 mean of equal rewards can miss them in the last bit (0.1 * 3 / 3); equal groups get exact zeros.
    adv = torch.where((r == r[:, :1]).all(dim=1, keepdim=True), torch.zeros_like(adv), adv)
    return adv.float()
