# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The V1 trainer seam's per-step rollout-entropy metrics (``trainer_seams.entropy_metrics``) over verl's padded batch:
the rows verl adds to fill the batch (6 kept rows of an over-sampled step padded to 8 for 2 ranks) are no rows of the
rollout, so ``rows_without_entropy`` does not count them, while a stock loop's real row is counted; the statistics are
those of the real rows' model-generated tokens, computed here with numpy."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
import torch

from treetune_verl.batch_keys import RESPONSE_ENTROPY_KEY
from treetune_verl.verl.v0_9_1.entropy_rows import rollout_entropy_rows

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

ROW_ENTROPY = [[0.5, 2.0, 1.0], [3.0, 0.2], None, [1.5, 0.25]]  # None: a stock loop's row
MASKS = [[1, 1, 1], [1, 0], [1, 1], [1, 1]]  # row 1's second token is not the model's
PADDING = [False, False, False, True]  # the last row: verl's padding, a copy of row 0's extra_fields


def _rows():
    extra = [{RESPONSE_ENTROPY_KEY: e} if e is not None else {} for e in ROW_ENTROPY]
    extra[3] = dict(extra[0])
    masks = [torch.tensor(m) for m in MASKS]
    keys = [f"k_{i}_0" for i in range(len(MASKS))]
    return rollout_entropy_rows(keys, extra, masks, PADDING), masks


def test_padding_rows_are_not_rows_without_entropy():
    from treetune_verl.verl.v0_9_1.trainer_seams import entropy_metrics

    rows, masks = _rows()
    metrics = entropy_metrics(rows, masks, PADDING)
    assert metrics["agent_loop/rollout_entropy/rows_without_entropy"] == 1.0  # the stock row only
    measured = np.array([0.5, 2.0, 1.0, 3.0])  # real rows with entropy, model tokens only
    assert metrics["agent_loop/rollout_entropy/mean"] == pytest.approx(measured.mean())
    assert metrics["agent_loop/rollout_entropy/p90"] == pytest.approx(np.percentile(measured, 90))
    assert metrics["agent_loop/rollout_entropy/max"] == 3.0
    # without the padding flags (the validation batches: verl pads only training batches) every row counts
    assert entropy_metrics(rows, masks)["agent_loop/rollout_entropy/rows_without_entropy"] == 2.0
