# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patch 2: device-memory queries on ``torch.cpu``, which verl calls through ``get_torch_device()``.

Upstream: ``verl/utils/device.py:get_torch_device`` (verl 0.7.1; in 0.9.1 the ``cpu`` platform's ``device_module``,
:mod:`verl_cpu.cpu_platform`) returns ``torch.cpu`` without an accelerator, and
``verl/utils/memory_utils.py:aggressive_empty_cache`` (lines 46-61, called from
``fsdp_workers.py:ActorRolloutRefWorker.init_model``), ``fsdp_workers.py:update_actor`` (lines 1021-1022) and
``verl/utils/fsdp_utils.py`` call ``memory_reserved`` / ``memory_allocated`` / ``max_memory_allocated`` /
``max_memory_reserved`` / ``empty_cache`` on it; torch 2.13's ``torch.cpu`` has none of them (``AttributeError``).
The stand-ins report 0 bytes (CPU tensors live in ordinary process memory, which verl logs separately as
``perf/cpu_memory_used_gb``) and ``empty_cache`` does nothing. Nothing is replaced: they are added only where torch
has no such attribute, and the patch refuses if torch already defines one.

verl 0.9.1 also restores the device's RNG from a checkpoint (``verl/utils/checkpoint/checkpoint_manager.py``
``load_rng_state``, lines 213-219): its saved state keys the CPU generator's state ``"cpu"``, which is also the device
name of the ``cpu`` platform, so a resumed run calls ``torch.cpu.set_rng_state`` (``AttributeError``). On CPU the
device's generator is the CPU generator: ``get_rng_state`` / ``set_rng_state`` are torch's own
``torch.get_rng_state`` / ``torch.set_rng_state``.
"""

from __future__ import annotations

from types import ModuleType

from verl_cpu._guard import MARK, PatchError, is_patched, require_cpu_only, require_signature, require_versions

PATCH = "torch_cpu_memory"
SUPPORTED = {"verl": ("0.7.1", "0.9.1"), "torch": ("2.13.0",)}


def memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


def max_memory_allocated(device=None) -> int:
    return 0


def max_memory_reserved(device=None) -> int:
    return 0


def empty_cache() -> None:
    return None


def get_rng_state(device=None):
    import torch

    return torch.get_rng_state()


def set_rng_state(new_state, device=None) -> None:
    import torch

    torch.set_rng_state(new_state)


STAND_INS = (
    memory_allocated,
    memory_reserved,
    max_memory_allocated,
    max_memory_reserved,
    empty_cache,
    get_rng_state,
    set_rng_state,
)
for _stand_in in STAND_INS:
    setattr(_stand_in, MARK, PATCH)


def apply(device: ModuleType) -> None:
    import torch

    if all(is_patched(getattr(torch.cpu, f.__name__, None)) for f in STAND_INS):
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    require_signature(PATCH, device.get_torch_device, (), "verl/utils/device.py:get_torch_device")
    present = [
        f.__name__
        for f in STAND_INS
        if hasattr(torch.cpu, f.__name__) and not is_patched(getattr(torch.cpu, f.__name__))
    ]
    if present:
        raise PatchError(
            f"verl_cpu.{PATCH}: torch.cpu already defines {present}; written for torch {' / '.join(SUPPORTED['torch'])}, "
            "where it does not. Drop or update this patch (tools/cpu_shims/verl_cpu)."
        )
    for stand_in in STAND_INS:
        setattr(torch.cpu, stand_in.__name__, stand_in)
