# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy``: the formula (``compute_entropy``, ``entropy_for_sampling``).

Plain torch, no sglang. Reference: :func:`reference_entropy`, written here in float64 over the finite entries
(``softmax`` and explicit ``-sum p log p``, top-k by sorting), and closed forms (uniform: log V, log k; one-hot: 0).
"""

import math

import pytest
import torch

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.entropy import compute_entropy, entropy_for_sampling


def reference_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Independent float64 formula over the finite entries: H = log Z - E_p[logit]."""
    out = []
    for row in logits.double():
        row = row[torch.isfinite(row)]
        p = torch.softmax(row, dim=-1)
        out.append(-(p * torch.log(p)).nansum())
    return torch.stack(out)


class TestComputeEntropy:
    def test_full_vocab_uniform(self):
        assert compute_entropy(torch.zeros(1, 4)).item() == pytest.approx(math.log(4), abs=1e-6)

    def test_full_vocab_one_hot(self):
        logits = torch.tensor([[0.0, -1e4, -1e4, -1e4]])
        assert compute_entropy(logits).item() == pytest.approx(0.0, abs=1e-6)

    def test_top_k_uniform(self):
        assert compute_entropy(torch.zeros(1, 4), top_k=2).item() == pytest.approx(math.log(2), abs=1e-6)

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_top_k_picks_the_k_largest(self, seed):
        torch.manual_seed(seed)
        logits = torch.randn(5, 50) * 3
        k = 7
        expected = reference_entropy(torch.sort(logits, dim=-1, descending=True).values[:, :k])
        got = compute_entropy(logits, top_k=k)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
        assert (got <= math.log(k) + 1e-6).all()

    @pytest.mark.parametrize("shape", [(3, 100), (1, 7), (16, 1000)])
    def test_batch_shape_dtype_and_bounds(self, shape):
        torch.manual_seed(0)
        logits = torch.randn(*shape) * 4
        got = compute_entropy(logits)
        assert got.shape == shape[:1] and got.dtype == torch.float32
        assert (got >= 0).all() and (got <= math.log(shape[1]) + 1e-5).all()
        torch.testing.assert_close(got.double(), reference_entropy(logits), rtol=1e-5, atol=1e-6)

    def test_top_k_at_least_vocab_is_full_vocab(self):
        torch.manual_seed(0)
        logits = torch.randn(4, 10)
        torch.testing.assert_close(compute_entropy(logits, top_k=10), compute_entropy(logits))
        torch.testing.assert_close(compute_entropy(logits, top_k=1000), compute_entropy(logits))
        torch.testing.assert_close(compute_entropy(logits, top_k=0), compute_entropy(logits))
        torch.testing.assert_close(compute_entropy(logits).double(), reference_entropy(logits), rtol=1e-5, atol=1e-6)

    def test_masked_logits_give_entropy_of_remaining_support(self):
        torch.manual_seed(0)
        logits = torch.randn(3, 12)
        logits[0, :6] = float("-inf")
        logits[1, 3] = float("-inf")
        got = compute_entropy(logits)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), reference_entropy(logits), rtol=1e-5, atol=1e-6)
        # top-k reaching into the masked region: masked entries still contribute nothing
        torch.testing.assert_close(
            compute_entropy(logits[:1], top_k=9).double(), reference_entropy(logits[:1]), rtol=1e-5, atol=1e-6
        )

    def test_single_finite_logit_is_zero(self):
        logits = torch.full((1, 5), float("-inf"))
        logits[0, 2] = 3.0
        assert compute_entropy(logits).item() == 0.0

    def test_all_masked_or_nan_rows_are_nan_not_a_number(self):
        logits = torch.zeros(3, 5)
        logits[0] = float("-inf")
        logits[1, 2] = float("nan")
        got = compute_entropy(logits)
        assert math.isnan(got[0]) and math.isnan(got[1])
        assert got[2].item() == pytest.approx(math.log(5), abs=1e-6)

    @pytest.mark.parametrize("top_k", [None, 3])
    def test_input_logits_are_left_untouched(self, top_k):
        # The sampler samples from these very logits after us; the in-place ops must only touch our temporaries.
        logits = torch.randn(4, 50)
        logits[0, :10] = float("-inf")
        before = logits.clone()
        compute_entropy(logits, top_k)
        assert torch.equal(logits, before)

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_low_precision_input_accumulates_in_float32(self, dtype):
        torch.manual_seed(0)
        logits = (torch.randn(8, 4096) * 3).to(dtype)
        got = compute_entropy(logits)
        assert got.dtype == torch.float32
        # Same numbers as float32 math on the (already rounded) low-precision logits.
        torch.testing.assert_close(got.double(), reference_entropy(logits.float()), rtol=1e-5, atol=1e-5)

    @pytest.mark.parametrize("bad", [-1, 2.5, "3", True])
    def test_bad_top_k_is_a_value_error(self, bad):
        with pytest.raises(ValueError, match="top_k"):
            compute_entropy(torch.zeros(1, 4), top_k=bad)


class TestEntropyForSampling:
    """One sampler step: raw ignores the temperatures, tempered divides by each row's T, top-k renormalises."""

    @pytest.fixture
    def step(self):
        generator = torch.Generator().manual_seed(3)
        logits = torch.randn(4, 40, generator=generator) * 3
        temperatures = torch.tensor([[0.5], [1.0], [1.7], [0.7]])
        return logits, temperatures

    @pytest.mark.parametrize("top_k", [None, 6])
    def test_raw_is_the_entropy_of_the_logits_whatever_the_temperature(self, step, top_k):
        logits, temperatures = step
        got = entropy_for_sampling(logits, temperatures, EntropyConfig(top_k=top_k))
        assert got.dtype == torch.float32 and got.shape == (4,)
        torch.testing.assert_close(got, entropy_for_sampling(logits, None, EntropyConfig(top_k=top_k)))
        kept = logits if top_k is None else torch.sort(logits, dim=-1, descending=True).values[:, :top_k]
        torch.testing.assert_close(got.double(), reference_entropy(kept), rtol=1e-5, atol=1e-6)

    @pytest.mark.parametrize("top_k", [None, 6])
    def test_tempered_is_the_entropy_of_logits_over_each_rows_temperature(self, step, top_k):
        logits, temperatures = step
        got = entropy_for_sampling(logits, temperatures, EntropyConfig(top_k=top_k, mode="tempered"))
        tempered = logits.double() / temperatures.double()
        kept = tempered if top_k is None else torch.sort(tempered, dim=-1, descending=True).values[:, :top_k]
        torch.testing.assert_close(got.double(), reference_entropy(kept), rtol=1e-5, atol=1e-6)
        raw = entropy_for_sampling(logits, temperatures, EntropyConfig(top_k=top_k))
        assert (got[[0, 2, 3]] - raw[[0, 2, 3]]).abs().min() > 0.01  # T != 1 changes the distribution
        torch.testing.assert_close(got[1], raw[1])  # T == 1 does not

    def test_input_logits_are_left_untouched(self, step):
        logits, temperatures = step
        before = logits.clone()
        entropy_for_sampling(logits, temperatures, EntropyConfig(top_k=6, mode="tempered"))
        assert torch.equal(logits, before)
