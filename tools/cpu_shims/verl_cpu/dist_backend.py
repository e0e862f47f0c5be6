# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patch 1: one gloo process group for verl's FSDP worker on CPU.

Upstream: ``verl/workers/fsdp_workers.py`` (verl 0.7.1), ``ActorRolloutRefWorker.__init__`` (lines 155-164) calls
``torch.distributed.init_process_group(backend=f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}")``. Without an
accelerator ``get_device_name()`` is ``"cpu"``, so the string is ``"cpu:gloo,cpu:nccl"`` and torch refuses it
(``ValueError: Duplicate device type cpu``). The replacement of ``torch.distributed.init_process_group`` (looked up
as a module attribute at call time) turns exactly ``"cpu:gloo,cpu:<anything>"`` into ``"gloo"`` and calls torch's
original; every other backend string passes through unchanged.
"""

from __future__ import annotations

from types import ModuleType

from verl_cpu._guard import is_patched, replacement_of, require_cpu_only, require_signature, require_versions

PATCH = "dist_backend"
SUPPORTED = {"verl": ("0.7.1",), "torch": ("2.13.0",)}
INIT_PROCESS_GROUP_PARAMETERS = (
    "backend",
    "init_method",
    "timeout",
    "world_size",
    "rank",
    "store",
    "group_name",
    "pg_options",
    "device_id",
    "_ranks",
)
WORKER_INIT_PARAMETERS = ("self", "config", "role", "kwargs")


def cpu_backend(backend: object) -> object:
    """``"cpu:gloo,cpu:nccl"`` (verl's string when the device is cpu) -> ``"gloo"``; anything else unchanged."""
    if isinstance(backend, str):
        parts = [part.split(":", 1) for part in backend.split(",")]
        if len(parts) == 2 and all(len(p) == 2 and p[0] == "cpu" for p in parts) and parts[0][1] == "gloo":
            return "gloo"
    return backend


def apply(fsdp_workers: ModuleType) -> None:
    import torch.distributed

    current = torch.distributed.init_process_group
    if is_patched(current):
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    require_signature(
        PATCH, current, INIT_PROCESS_GROUP_PARAMETERS, "torch/distributed/distributed_c10d.py:init_process_group"
    )
    require_signature(
        PATCH,
        fsdp_workers.ActorRolloutRefWorker.__init__,
        WORKER_INIT_PARAMETERS,
        "verl/workers/fsdp_workers.py:ActorRolloutRefWorker.__init__",
    )

    @replacement_of(current, PATCH)
    def init_process_group(backend=None, *args, **kwargs):
        return current(cpu_backend(backend), *args, **kwargs)

    torch.distributed.init_process_group = init_process_group
