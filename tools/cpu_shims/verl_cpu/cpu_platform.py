# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: a ``cpu`` platform in verl's own platform registry, selected with ``VERL_PLATFORM=cpu``.

Upstream: ``verl/plugin/platform/platform_manager.py`` (verl 0.9.1). Every device question verl asks
(``verl/utils/device.py``: device name, torch device module, device id, collective backend, Ray resource) goes to
``get_platform()``, which without an accelerator falls back to ``nvidia`` (``_detect_platform_name``: device
``cuda``, backend ``nccl``). ``PlatformRegistry.register`` is verl's documented way to add a platform from outside
its tree ("External plugins ... can register their own platform classes"); this patch registers one right after the
registry module is executed, in every process. Nothing is replaced, and nothing changes unless ``VERL_PLATFORM=cpu``
selects it (the e2e script sets it on CPU).

Two answers differ from a literal CPU description, on purpose:

- ``current_device()`` returns ``"cpu"``, not an index: verl passes it straight to ``.to(device=...)`` /
  ``device=`` (``verl/utils/fsdp_utils.py`` ``load_fsdp_model_to_gpu`` and model init: ``model.to(device=0)`` is
  CUDA device 0, ``RuntimeError: Cannot access accelerator device``).
- ``ray_resource_name()`` is ``"CPU"`` and ``ray_resource_options`` asks for nothing: the placement bundle becomes
  ``{"CPU": 1}`` (``verl/single_controller/ray/base.py`` ``get_placement_groups``) and the actors request no
  accelerator (Ray refuses ``resources={"CPU": n}``). The run still declares ``ray_init.num_gpus`` because
  ``RayResourcePool`` counts only GPUs before it places anything.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

from verl_cpu._guard import MARK, PatchError, require_cpu_only, require_signature, require_versions

PATCH = "cpu_platform"
SUPPORTED = {"verl": ("0.9.1",)}
NAME = "cpu"


def platform_class(base: type) -> type:
    """A concrete ``PlatformBase`` for CPU-only processes (every abstract method answered)."""
    import torch

    class PlatformCPU(base):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = torch.cpu

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return False  # never auto-detected: only VERL_PLATFORM=cpu selects it

        def current_device(self) -> str:  # type: ignore[override]  # see the module docstring
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # read by verl's sglang server launcher whatever the platform

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {}

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False  # read by vLLM's weight transfer only

        def cudart(self) -> Any:
            return None

    PlatformCPU.__module__ = __name__
    setattr(PlatformCPU, MARK, PATCH)
    return PlatformCPU


def apply(platform_manager: ModuleType) -> None:
    registry = platform_manager.PlatformRegistry
    registered = registry.get(NAME)
    if registered is not None and getattr(registered, MARK, None) == PATCH:
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    if registered is not None:
        raise PatchError(
            f"verl_cpu.{PATCH}: verl/plugin/platform/platform_manager.py already has a {NAME!r} platform "
            f"({registered.__name__}); written for verl {SUPPORTED['verl'][0]}, which has none. Re-check it."
        )
    require_signature(PATCH, registry.register, ("platform",), "verl/plugin/platform/platform_manager.py:register")
    registry.register(platform=NAME)(platform_class(platform_manager.PlatformBase))
