# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patch 4: torch's ``file_system`` sharing strategy for CPU tensors sent through sglang's serializer.

Upstream: verl's weight sync (``verl/workers/rollout/sglang_rollout/sglang_rollout.py:ServerAdapter.update_weights``
-> ``sglang/srt/weight_sync/utils.py:update_weights``) pickles each tensor with
``sglang/srt/utils/common.py:MultiprocessingSerializer.serialize`` (``ForkingPickler``) in the FSDP worker and the
scheduler process unpickles it. For a CPU tensor torch's default ``file_descriptor`` strategy passes the storage as a
file descriptor through ``multiprocessing.resource_sharer``, which authenticates with the *sender's* authkey; the
scheduler is not the worker's child, so it fails (``AuthenticationError: digest sent was rejected``, then verl's
``Failed to complete async request to update_weights_from_tensor after 3 attempts``). With ``file_system`` the
storage travels as a shared-memory file name, which any local process can open. Set in every process that imports
sglang's serializer (sender and receiver alike).
"""

from __future__ import annotations

from types import ModuleType

from verl_cpu._guard import PatchError, require_cpu_only, require_signature, require_versions

PATCH = "sharing_strategy"
SUPPORTED = {"sglang": ("0.5.6.post2", "0.5.12"), "torch": ("2.13.0",)}
STRATEGY = "file_system"


def apply(common: ModuleType) -> None:
    import torch.multiprocessing

    if torch.multiprocessing.get_sharing_strategy() == STRATEGY:
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    serializer = common.MultiprocessingSerializer
    require_signature(
        PATCH,
        serializer.serialize,
        ("obj", "output_str"),
        "sglang/srt/utils/common.py:MultiprocessingSerializer.serialize",
    )
    require_signature(
        PATCH, serializer.deserialize, ("data",), "sglang/srt/utils/common.py:MultiprocessingSerializer.deserialize"
    )
    if STRATEGY not in torch.multiprocessing.get_all_sharing_strategies():
        raise PatchError(f"verl_cpu.{PATCH}: torch offers no {STRATEGY!r} sharing strategy on this platform")
    torch.multiprocessing.set_sharing_strategy(STRATEGY)
