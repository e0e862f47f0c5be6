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
    mask_outside_support(masked, positions, supports, temperature)
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
        assert float(got[outside].exp().sum()) < 1e-20  # no mass outside that float32 could hold beside 1
        # 64 nats below the support's mode after the temperature (bfloat16 rounds the fill): above -87, where CPU's
        # exp leaves its fast path, far below anything float32 resolves
        gap = scaled[position, outside] - scaled[position, ids].max()
        assert float(gap.max()) == pytest.approx(-64, abs=3) and float(gap.min()) == float(gap.max())
        assert float(entropy[position]) == pytest.approx(float(-(expected.exp() * expected).sum()), abs=1e-4)


def test_gradients_reach_the_kept_logits_only():
    torch.manual_seed(0)
    logits = torch.randn(3, 10, requires_grad=True)
    work = logits * 1.0  # a non-leaf, as the model's output is
    mask_outside_support(work, torch.tensor([1]), [[2, 5]], 0.7)
    torch.log_softmax(work / 0.7, dim=-1)[1, 2].backward()  # verl's temperature, then its log-softmax
    grad = logits.grad[1]
    # the masked logits are constants e^-64 below: their gradient is their softmax share, nothing float32 resolves
    assert grad[[2, 5]].abs().min() > 1e-3 and grad[[0, 1, 3, 4, 6, 7, 8, 9]].abs().max() < 1e-25
    assert logits.grad[[0, 2]].abs().max() == 0


def test_refusals():
    with pytest.raises(ValueError, match="float16"):
        mask_outside_support(torch.zeros(2, 4, dtype=torch.float16), torch.tensor([0]), [[1]], 1.0)
    with pytest.raises(ValueError, match="empty supports"):
        mask_outside_support(torch.zeros(2, 4), torch.tensor([0]), [[]], 1.0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        mask_outside_support(torch.zeros(2, 4), torch.tensor([0]), [[4]], 1.0)
    with pytest.raises(ValueError, match="2 positions for 1 supports"):
        mask_outside_support(torch.zeros(2, 4), torch.tensor([0, 1]), [[1]], 1.0)
    with pytest.raises(ValueError, match="positive temperatures"):
        mask_outside_support(torch.zeros(2, 4), torch.tensor([0]), [[1]], 0.0)


def test_one_temperature_per_position():
    logits = 4 * torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    masked = logits.clone()
    temperatures = torch.tensor([0.5, 2.0])
    mask_outside_support(masked, torch.tensor([0, 2]), [[1, 4], [7]], temperatures)
    for position, ids, temperature in ((0, [1, 4], 0.5), (2, [7], 2.0)):
        outside = [i for i in range(20) if i not in ids]
        gap = (masked[position, outside] - logits[position, ids].max()) / temperature
        assert torch.allclose(gap, torch.full_like(gap, -64.0))


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

    # verl 0.7.1's padded rows: the mask runs past the row's supports, zeros there
    def pad(rows, length):
        return [torch.cat([row, torch.zeros(length - len(row), dtype=row.dtype)]) for row in rows]

    padded = support_metrics(supports, pad(masks, 5), pad(old, 5), pad(rollout, 5))
    assert padded == m
    with pytest.raises(ValueError, match="row 0: 3 supports for a response mask of 4"):
        support_metrics(
            supports,
            [torch.tensor([1, 1, 0, 1]), masks[1]],
            pad(old, 4)[:1] + old[1:],
            pad(rollout, 4)[:1] + rollout[1:],
        )
