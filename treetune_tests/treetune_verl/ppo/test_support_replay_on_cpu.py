# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``ppo/support_replay.py``: logits masked outside a support give the distribution renormalised over it, in the
formulas verl applies after it (temperature, ``log_softmax``, verl's own ``entropy_from_logits``), with no NaN, and
gradients only on the kept logits. References written here: ``torch.log_softmax`` over the kept ids alone."""

from __future__ import annotations

import pytest
import torch

from treetune_verl.ppo.support_replay import mask_outside_support


@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_logits_are_the_renormalised_distribution(temperature, dtype):
    from verl.utils.torch_functional import entropy_from_logits

    gen = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(5, 50, generator=gen)).to(dtype)
    supports = [[3], [7, 1, 40], list(range(0, 50, 2))]
    positions = torch.tensor([0, 2, 4])
    masked = logits.clone()
    mask_outside_support(masked, positions, supports)
    assert torch.equal(masked[[1, 3]], logits[[1, 3]])  # other positions untouched
    scaled = masked.float() / temperature
    entropy = entropy_from_logits(scaled)
    assert torch.isfinite(entropy).all()
    for position, ids in zip(positions.tolist(), supports, strict=True):
        expected = torch.log_softmax(logits[position, ids].float() / temperature, dim=-1)
        got = torch.log_softmax(scaled[position], dim=-1)
        assert torch.allclose(got[ids], expected, atol=1e-5)
        outside = torch.ones(50, dtype=torch.bool)
        outside[ids] = False
        assert float(got[outside].exp().max()) == 0.0  # exactly no mass outside
        assert float(entropy[position]) == pytest.approx(float(-(expected.exp() * expected).sum()), abs=1e-4)


def test_gradients_reach_the_kept_logits_only():
    logits = torch.randn(3, 10, requires_grad=True)
    work = logits * 1.0  # a non-leaf, as the model's output is
    mask_outside_support(work, torch.tensor([1]), [[2, 5]])
    torch.log_softmax(work, dim=-1)[1, 2].backward()
    grad = logits.grad[1]
    assert grad[[2, 5]].abs().min() > 0 and grad[[0, 1, 3, 4, 6, 7, 8, 9]].abs().max() == 0
    assert logits.grad[[0, 2]].abs().max() == 0


def test_refusals():
    with pytest.raises(ValueError, match="float16"):
        mask_outside_support(torch.zeros(2, 4, dtype=torch.float16), torch.tensor([0]), [[1]])
    with pytest.raises(ValueError, match="empty supports"):
        mask_outside_support(torch.zeros(2, 4), torch.tensor([0]), [[]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        mask_outside_support(torch.zeros(2, 4), torch.tensor([0]), [[4]])
    with pytest.raises(ValueError, match="2 positions for 1 supports"):
        mask_outside_support(torch.zeros(2, 4), torch.tensor([0, 1]), [[1]])


def test_support_metrics_counted_by_hand():
    from treetune_verl.trainer.metrics import support_metrics

    supports = [
        [(2, 0.8, -0.1, [3, 4]), (50, 1.0, -2.0, None), (1, 0.5, 0.0, [7])],  # last token: not a model token
        None,  # replay off or another loop: ratios only
    ]
    masks = [torch.tensor([1, 1, 0]), torch.tensor([1, 1])]
    old = [torch.tensor([-0.5, -1.0, -3.0]), torch.log(torch.tensor([0.5, 0.95]))]
    rollout = [torch.tensor([-0.5, -1.0 - 0.2, 0.0]), torch.zeros(2)]
    m = support_metrics(supports, masks, old, rollout)
    ratios = [1.0, float(torch.exp(torch.tensor(0.2))), 0.5, 0.95]  # model tokens only
    assert m["rollout_support/importance_ratio_mean"] == pytest.approx(sum(ratios) / 4)
    assert m["rollout_support/importance_ratio_outside_0.9_1.1"] == pytest.approx(2 / 4)  # 1.22 and 0.5
    assert m["rollout_support/untruncated_share"] == pytest.approx(1 / 2)
    assert (m["rollout_support/size_mean"], m["rollout_support/kept_mass_mean"]) == (2.0, 0.8)
    assert m["rollout_support/size_p99"] == 2.0
