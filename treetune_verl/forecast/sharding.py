# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""This process's shard of a parameter, gradient or optimizer-state tensor.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``, verl's ``strategy=fsdp2``) parameters and their ``.grad`` are
``DTensor``s sharded along dim 0; the forecast's Δθ and inner products use this rank's local shard only, and a sum
over all parameters is the sum over ranks of the per-shard sums. Plain tensors (one process) are returned as they
are.
"""

from __future__ import annotations

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch build without torch.distributed
    DTensor = None  # type: ignore[assignment,misc]


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a ``DTensor`` (FSDP2)."""
    return DTensor is not None and isinstance(tensor, DTensor)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a ``DTensor``; any other tensor unchanged."""
    return tensor.to_local() if is_sharded(tensor) else tensor
