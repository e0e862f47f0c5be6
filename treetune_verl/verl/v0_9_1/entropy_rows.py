# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Each V1 row's ``rollout_entropy`` from the ``extra_fields["response_entropy"]`` its agent loop left.

verl 0.9.1's V1 trainer keeps rows unpadded in TransferQueue (one jagged row per trajectory turn), and TransferQueue
refuses a field that some rows lack, so the loops cannot add a field of their own; every row has ``extra_fields``.
The trainer builds the two fields from it (``trainer_seams.py``). No verl import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from treetune_verl.batch_keys import HAS_ROLLOUT_ENTROPY_KEY, RESPONSE_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.rollout.entropy_row import entropy_row


def rollout_entropy_rows(
    keys: Sequence[str],
    extra_fields: Sequence[Mapping[str, Any] | None],
    response_masks: Sequence[torch.Tensor],
    padding: Sequence[bool],
) -> list[dict[str, torch.Tensor]]:
    """Per row, ``{"rollout_entropy": float32 [R_i] (nats), "has_rollout_entropy": bool []}``.

    Args:
        keys: the rows' TransferQueue keys (named in errors).
        extra_fields: each row's ``extra_fields``; ``response_entropy`` holds one value per response token.
        response_masks: each row's ``response_mask``, ``[R_i]`` 0/1 (1: a model-generated token); the entropy is 0.0
            wherever it is 0, as ``responses`` are padded.
        padding: rows verl added to fill the batch (tag ``is_padding``): they copy a real row's ``extra_fields``
            but not its response, so they carry no entropy.

    Rows without ``response_entropy`` (a stock verl loop) get zeros and ``has_rollout_entropy=False``: their zeros
    are not measured entropies.

    Raises:
        ValueError: a row whose entropy does not count one value per response token, or holds a non-finite value,
            naming the row's key (``rollout/entropy_row.py``, the rule of both stacks).
    """
    rows = []
    for key, fields, mask, pad in zip(keys, extra_fields, response_masks, padding, strict=True):
        length = mask.numel()
        values = None if pad else (fields or {}).get(RESPONSE_ENTROPY_KEY)
        entropy = entropy_row(values, length, length, f"row {key}") * mask.reshape(-1).to(torch.float32)
        rows.append({ROLLOUT_ENTROPY_KEY: entropy, HAS_ROLLOUT_ENTROPY_KEY: torch.tensor(values is not None)})
    return rows
