# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patch 1: one gloo process group for verl's training workers on CPU.

Upstream: ``verl/workers/fsdp_workers.py`` (verl 0.7.1), ``ActorRolloutRefWorker.__init__`` (lines 155-164), and
``verl/utils/distributed.py`` (verl 0.9.1), ``initialize_global_process_group_ray`` (line 89), call
``torch.distributed.init_process_group(backend=f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}")``. Without an
accelerator the device is ``"cpu"``, so the string is ``"cpu:gloo,cpu:nccl"`` (0.7.1) or ``"cpu:gloo,cpu:gloo"``
(0.9.1 with the ``cpu`` platform of :mod:`verl_cpu.cpu_platform`) and torch refuses it
(``ValueError: Duplicate device type cpu``). The replacement of ``torch.distributed.init_process_group`` (looked up
as a module attribute at call time) turns exactly ``"cpu:gloo,cpu:<anything>"`` into ``"gloo"`` and calls torch's
original; every other backend string passes through unchanged.
"""

from __future__ import annotations

import operator
from types import ModuleType

from verl_cpu._guard import (
    installed_version,
    is_patched,
    replacement_of,
    require_cpu_only,
    require_signature,
    require_versions,
)

PATCH = "dist_backend"
SUPPORTED = {"verl": ("0.7.1", "0.9.1"), "torch": ("2.13.0",)}
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
# verl version -> (the function that builds the backend string, its parameters, where it is)
CALLERS = {
    "0.7.1": ("ActorRolloutRefWorker.__init__", ("self", "config", "role", "kwargs"), "verl/workers/fsdp_workers.py"),
    "0.9.1": ("initialize_global_process_group_ray", ("timeout_second", "backend"), "verl/utils/distributed.py"),
}


def cpu_backend(backend: object) -> object:
    """``"cpu:gloo,cpu:nccl"`` (verl's string when the device is cpu) -> ``"gloo"``; anything else unchanged."""
    if isinstance(backend, str):
        parts = [part.split(":", 1) for part in backend.split(",")]
        if len(parts) == 2 and all(len(p) == 2 and p[0] == "cpu" for p in parts) and parts[0][1] == "gloo":
            return "gloo"
    return backend


def apply(module: ModuleType) -> None:
    """``module``: ``verl.workers.fsdp_workers`` (verl 0.7.1) or ``verl.utils.distributed`` (verl 0.9.1)."""
    import torch.distributed

    current = torch.distributed.init_process_group
    if is_patched(current):
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    require_signature(
        PATCH, current, INIT_PROCESS_GROUP_PARAMETERS, "torch/distributed/distributed_c10d.py:init_process_group"
    )
    name, parameters, where = CALLERS[installed_version("verl")]
    require_signature(PATCH, operator.attrgetter(name)(module), parameters, f"{where}:{name}")

    @replacement_of(current, PATCH)
    def init_process_group(backend=None, *args, **kwargs):
        return current(cpu_backend(backend), *args, **kwargs)

    torch.distributed.init_process_group = init_process_group
