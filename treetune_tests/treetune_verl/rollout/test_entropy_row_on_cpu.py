# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy_row``, the one builder of a response's ``rollout_entropy`` row on both stacks: padded like ``responses``,
zeros for a row that carries none, refusals naming the row (misaligned, non-finite). Pure (torch only)."""

from __future__ import annotations

import math

import pytest
import torch

from treetune_verl.rollout.entropy_row import entropy_row


def test_values_then_zeros_to_the_right():
    row = entropy_row([0.5, 1.5], num_tokens=2, length=4, where="r")
    assert row.dtype == torch.float32 and row.tolist() == [0.5, 1.5, 0.0, 0.0]
    assert entropy_row([0.25, 3.0], 2, 2, "r").tolist() == [0.25, 3.0]  # jagged: the row is the response


def test_a_row_that_carries_none_is_zeros():
    assert torch.equal(entropy_row(None, 3, 4, "r"), torch.zeros(4))


@pytest.mark.parametrize(
    ("values", "num_tokens", "length", "message"),
    [
        ([0.5], 2, 4, r"row u_1_0: response_entropy has 1 values for 2 response tokens"),
        ([0.5, 0.5, 0.5], 3, 2, r"row u_1_0: response_entropy has 3 values for 3 response tokens \(row length 2\)"),
        ([0.5, math.nan], 2, 4, r"row u_1_0: response_entropy holds a non-finite entropy \(nan\) at token 1"),
        ([math.inf], 1, 1, r"row u_1_0: .* non-finite entropy \(inf\) at token 0"),
    ],
)
def test_misaligned_or_non_finite_values_are_refused_naming_the_row(values, num_tokens, length, message):
    with pytest.raises(ValueError, match=message):
        entropy_row(values, num_tokens, length, "row u_1_0")
