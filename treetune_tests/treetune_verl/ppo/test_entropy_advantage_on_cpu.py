# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Forking-token mask and entropy-shaped advantages, by hand and through verl 0.7.1's real policy loss.

The gradient check: verl's own ``vanilla`` policy loss (``core_algos.compute_policy_loss_vanilla``, PPO clip,
``token-mean``) on advantages masked by :func:`forking_token_mask` against a PPO-clip loss written here over the kept
tokens only, normalised by every response token (TRL's ``top_entropy_quantile`` normaliser), on a tiny parameterised
policy with ratios both inside and outside the clip range.
"""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import FSDPActorConfig, FSDPEngineConfig

from treetune_verl.ppo.entropy_advantage import entropy_shaped_advantages, forking_token_mask, mask_advantages

ENTROPY = torch.tensor([[3.0, 1.0, 2.0, 0.0], [5.0, 4.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_top_share_by_hand():
    keep, metrics = forking_token_mask(ENTROPY, MASK, 0.4)  # 5 tokens -> the 2 highest: 5 and 4
    assert keep.tolist() == [[False, False, False, False], [True, True, False, False]]
    assert metrics == pytest.approx(
        {"threshold": 4.0, "kept_share": 0.4, "entropy_kept_mean": 4.5, "entropy_dropped_mean": 2.0}
    )
    keep, metrics = forking_token_mask(ENTROPY, MASK, 0.5)  # ceil(2.5) = 3: 5, 4, 3
    assert keep.sum() == 3 and metrics["threshold"] == 3.0
    # padding and masked positions are never kept, whatever their entropy
    keep, _ = forking_token_mask(torch.full((2, 4), 9.0), MASK, 1.0)
    assert torch.equal(keep, MASK.bool())


def test_ties_at_the_threshold_are_all_kept_and_few_tokens():
    entropy, mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 2.0]]), torch.ones(1, 5)
    keep, metrics = forking_token_mask(entropy, mask, 0.4)  # k = 2: 2.0 and one of the 1.0 -> every 1.0 ties
    assert keep.all() and metrics["kept_share"] == 1.0 and "entropy_dropped_mean" not in metrics
    keep, metrics = forking_token_mask(torch.tensor([[0.7]]), torch.ones(1, 1), 0.2)  # ceil(0.2) = 1 token kept
    assert keep.all() and metrics["threshold"] == pytest.approx(0.7)
    keep, metrics = forking_token_mask(ENTROPY, torch.zeros_like(MASK), 0.2)  # no response token at all
    assert not keep.any() and metrics == {"kept_share": 0.0}
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="pg_token_quantile must be in"):
            forking_token_mask(ENTROPY, MASK, bad)


def test_quantile_one_leaves_the_advantages_bit_for_bit():
    advantages = torch.randn(2, 4) * MASK
    keep, _ = forking_token_mask(ENTROPY, MASK, 1.0)
    assert torch.equal(mask_advantages(advantages, keep, MASK), advantages)


def test_entropy_shaped_advantages_by_hand():
    advantages = torch.tensor([[1.0, -1.0, 0.2, 0.0]])
    entropy = torch.tensor([[2.0, 2.0, 2.0, 2.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    shaped, metrics = entropy_shaped_advantages(advantages, entropy, mask, alpha=0.4, kappa=2.0)
    # bonus min(0.4 * 2, |A| / 2) = 0.5, 0.5, 0.1; never at padding; a negative advantage stays negative
    assert torch.allclose(shaped, torch.tensor([[1.5, -0.5, 0.3, 0.0]]))
    assert metrics == pytest.approx({"bonus_mean": 1.1 / 3, "capped_share": 1.0})
    shaped, metrics = entropy_shaped_advantages(advantages, entropy * 0.1, mask, alpha=0.4, kappa=2.0)
    # bonus min(0.4 * 0.2, |A| / 2) = 0.08 everywhere (caps 0.5, 0.5, 0.1): nothing capped
    assert torch.allclose(shaped, torch.tensor([[1.08, -0.92, 0.28, 0.0]]))
    assert metrics == pytest.approx({"bonus_mean": 0.08, "capped_share": 0.0})
    with pytest.raises(ValueError, match="kappa > 1"):
        entropy_shaped_advantages(advantages, entropy, mask, alpha=0.4, kappa=1.0)


def _actor_config() -> FSDPActorConfig:
    return FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=4,
        loss_agg_mode="token-mean",
        clip_ratio=0.2,
        entropy_coeff=0.0,
        use_kl_loss=False,
        rollout_n=1,
        use_torch_compile=False,
        fsdp_config=FSDPEngineConfig(dtype="float32"),
    )


def _policy_grads(advantages: torch.Tensor, loss_fn) -> torch.Tensor:
    """Gradient of ``loss_fn(log_prob, old_log_prob, advantages)`` w.r.t. a tiny policy's logits ``[4, 6, 5]``."""
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 5, requires_grad=True)
    tokens = torch.randint(0, 5, (4, 6))
    log_prob = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old_log_prob = log_prob.detach() + 0.3 * torch.randn(4, 6)  # ratios inside and outside [0.8, 1.2]
    loss_fn(log_prob, old_log_prob, advantages).backward()
    return logits.grad


def test_gradient_equals_a_loss_over_the_kept_tokens_only():
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    entropy = torch.rand(4, 6) * 3 * mask
    advantages = torch.randn(4, 1).expand(4, 6) * mask  # GRPO-like: one value per row, masked
    keep, metrics = forking_token_mask(entropy, mask, 0.2)
    assert metrics["kept_share"] == pytest.approx(3 / 15)  # 15 response tokens: the ceil(0.2 * 15) = 3 highest
    masked = mask_advantages(advantages, keep, mask)
    vanilla, config = get_policy_loss_fn("vanilla"), _actor_config()

    def verl_loss(log_prob, old_log_prob, adv):
        loss, _ = vanilla(old_log_prob, log_prob, adv, mask, loss_agg_mode="token-mean", config=config)
        return loss

    def kept_only(log_prob, old_log_prob, adv):  # written here: PPO clip over the kept tokens, / all response tokens
        ratio = torch.exp(log_prob - old_log_prob)
        per_token = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2))
        return (per_token * keep).sum() / mask.sum()

    ours, reference = _policy_grads(masked, verl_loss), _policy_grads(masked, kept_only)
    assert torch.allclose(ours, reference, rtol=1e-5, atol=1e-7)
    stock = _policy_grads(advantages, verl_loss)
    assert not torch.allclose(ours, stock)  # the mask changed the update
    # q = 1: exactly verl's gradient
    everything, _ = forking_token_mask(entropy, mask, 1.0)
    assert torch.equal(_policy_grads(mask_advantages(advantages, everything, mask), verl_loss), stock)
