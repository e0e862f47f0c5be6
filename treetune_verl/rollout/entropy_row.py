# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""One response's ``rollout_entropy`` row from the per-token entropies its agent loop carried: the one builder of
both stacks (verl 0.7.1's worker pads rows to ``response_length``, verl 0.9.1's trainer keeps them jagged).

One rule for what a row may hold: one finite value per response token, or nothing (a loop that carries no entropy,
a padding row): then zeros, which the caller marks ``has_rollout_entropy=False`` so that no metric reads them. A
missing or non-finite entropy is never turned into a number (a NaN would poison every mean it enters; 0.0 would be
read as a certain token). No verl import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from treetune_verl.batch_keys import RESPONSE_ENTROPY_KEY


def entropy_row(values: Sequence[float] | None, num_tokens: int, length: int, where: str) -> torch.Tensor:
    """``[length]`` float32 entropies (nats): ``values`` then 0.0 to the right, as verl pads ``responses``.

    Args:
        values: the loop's ``response_entropy``, one per response token; ``None`` for a row that carries none (all
            zeros: the caller marks it not measured).
        num_tokens: the response's token count, the number of values expected.
        length: the row's length (``response_length`` when padded; ``num_tokens`` when jagged).
        where: the row, named in errors (``row <TransferQueue key>``, ``an agent loop's output``).

    Raises:
        ValueError: not one value per response token, more tokens than the row holds, or a non-finite value
            (naming ``where`` and the first bad token).
    """
    row = torch.zeros(length, dtype=torch.float32)
    if values is None:
        return row
    if len(values) != num_tokens or num_tokens > length:
        raise ValueError(
            f"{where}: {RESPONSE_ENTROPY_KEY} has {len(values)} values for {num_tokens} response tokens (row length "
            f"{length})"
        )
    bad = next((index for index, value in enumerate(values) if not math.isfinite(value)), None)
    if bad is not None:
        raise ValueError(f"{where}: {RESPONSE_ENTROPY_KEY} holds a non-finite entropy ({values[bad]}) at token {bad}")
    row[:num_tokens] = torch.tensor(values, dtype=torch.float32)
    return row
