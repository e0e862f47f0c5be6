# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Each V1 row's ``rollout_entropy`` from its ``extra_fields``: aligned, masked, stock and padding rows marked, bad rows
refused by key. Pure (torch only): runs on both stacks."""

from __future__ import annotations

import math

import pytest
import torch

from treetune_verl.batch_keys import HAS_ROLLOUT_ENTROPY_KEY, RESPONSE_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.verl.v0_9_1.entropy_rows import rollout_entropy_rows


def _mask(*bits: int) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int64)


def test_rows_align_with_their_response_and_zero_off_the_mask():
    rows = rollout_entropy_rows(
        keys=["u_0_0", "u_1_0"],
        extra_fields=[{RESPONSE_ENTROPY_KEY: [0.5, 1.25, 2.0]}, {RESPONSE_ENTROPY_KEY: [0.75, 3.0], "other": 1}],
        response_masks=[_mask(1, 1, 1), _mask(1, 0)],  # the second row's last token is not the model's
        padding=[False, False],
    )
    assert rows[0][ROLLOUT_ENTROPY_KEY].tolist() == [0.5, 1.25, 2.0]
    assert rows[1][ROLLOUT_ENTROPY_KEY].tolist() == [0.75, 0.0]
    assert all(row[ROLLOUT_ENTROPY_KEY].dtype == torch.float32 and bool(row[HAS_ROLLOUT_ENTROPY_KEY]) for row in rows)


def test_stock_rows_and_padding_rows_are_marked_not_measured():
    """A stock loop's row has no entropy; verl's padding row copies a real row's extra_fields, not its response."""
    copied = {RESPONSE_ENTROPY_KEY: [0.5, 1.0, 1.5]}
    rows = rollout_entropy_rows(
        keys=["stock_0_0", "pad_0_0"],
        extra_fields=[{"turn_scores": []}, copied],
        response_masks=[_mask(1, 1), _mask(0)],
        padding=[False, True],
    )
    assert [row[ROLLOUT_ENTROPY_KEY].tolist() for row in rows] == [[0.0, 0.0], [0.0]]
    assert [bool(row[HAS_ROLLOUT_ENTROPY_KEY]) for row in rows] == [False, False]


def test_none_extra_fields_is_a_row_without_entropy():
    (row,) = rollout_entropy_rows(["k"], [None], [_mask(1)], [False])
    assert not bool(row[HAS_ROLLOUT_ENTROPY_KEY])


@pytest.mark.parametrize(
    ("values", "message"),
    [([0.5], "row bad_3_0: .* 1 values for 2 response tokens"), ([0.5, math.nan], "row bad_3_0: .* non-finite")],
)
def test_a_misaligned_or_non_finite_row_is_refused_by_its_key(values, message):
    with pytest.raises(ValueError, match=message):
        rollout_entropy_rows(["bad_3_0"], [{RESPONSE_ENTROPY_KEY: values}], [_mask(1, 1)], [False])
