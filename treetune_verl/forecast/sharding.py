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


def reshard(model: torch.nn.Module) -> None:
    """Free every FSDP2 module's gathered (unsharded) parameters, so that the next forward gathers the shards again.

    Needed before writing into the shards between forwards without a backward: FSDP2 keeps the root module's
    parameters gathered after a forward (it expects the backward next), and a later forward reuses them as they are
    (``FSDPParamGroup.unshard`` is a no-op when unsharded), i.e. the weights from before the write. Local, no
    collective; a no-op for a module without FSDP2.
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
