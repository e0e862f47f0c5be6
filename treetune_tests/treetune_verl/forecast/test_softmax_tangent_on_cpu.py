# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast exact in the softmax against entropies written here, on logits that are exactly quadratic along the
step (ℓ(t) = ℓ₀ + t·ℓ̇ + t²·a): the central difference removes the network's curvature a and keeps the softmax's."""

import pytest
import torch

from treetune_verl.forecast.softmax_tangent import SoftmaxTangent, per_position


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    log_p = torch.log_softmax(logits.double(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def test_entropy_of_the_logits_moved_along_their_tangent():
    gen = torch.Generator().manual_seed(0)
    T, V = 600, 97  # more tokens than one chunk
    ell = torch.randn(T, V, generator=gen, dtype=torch.float64) * 3  # peaked and flat rows
    ell[:50, 0] += 12  # nearly one-hot: where the softmax's curvature dominates
    ell_dot = torch.randn(T, V, generator=gen, dtype=torch.float64)
    curvature = torch.randn(T, V, generator=gen, dtype=torch.float64)
    plus, theta, minus = ell + ell_dot + curvature, ell, ell - ell_dot + curvature
    # log-probabilities, not logits: a shift per row changes nothing
    as_log_probs = [torch.log_softmax(x, dim=-1).float() for x in (plus, theta, minus)]
    tangent = SoftmaxTangent(as_log_probs[0].clone())
    tangent.add_theta(as_log_probs[1])
    got = tangent.changes(as_log_probs[2])
    expected = _entropy(ell + ell_dot) - _entropy(ell)
    assert got.dtype == torch.float64 and got.shape == (T,)
    assert torch.allclose(got, expected, atol=2e-5)  # float32 log-probabilities in, fp64 softmax
    first_order = (_entropy(plus) - _entropy(minus)) / 2
    assert (got - first_order).abs()[:50].max() > 0.1  # not the tangent: the softmax's curvature is kept


def test_refuses_out_of_order_or_misshapen_passes():
    tangent = SoftmaxTangent(torch.zeros(3, 5))
    with pytest.raises(RuntimeError, match="before add_theta"):
        tangent.changes(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="at θ"):
        tangent.add_theta(torch.zeros(4, 5))
    tangent.add_theta(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="θ − Δθ"):
        tangent.changes(torch.zeros(3, 6))


def test_a_zero_step_changes_nothing():
    log_probs = torch.log_softmax(torch.randn(7, 11, generator=torch.Generator().manual_seed(1)), dim=-1)
    tangent = SoftmaxTangent(log_probs.clone())
    tangent.add_theta(log_probs)
    assert tangent.changes(log_probs).abs().max() == 0.0


def test_per_position_puts_tokens_back_in_mask_order():
    mask = torch.tensor([[[True, True, False], [True, False, False]]])
    assert per_position(torch.tensor([1.0, 2.0, 3.0]), mask).tolist() == [[[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]]
