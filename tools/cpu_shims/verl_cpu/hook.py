# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The import hook: applies each patch right after its target module has been executed, in whichever process.

Installed by the ``.pth`` line that ``tools/cpu_env/setup.sh`` writes (only when ``TREETUNE_VERL_CPU_PATCHES=1``), so
it is active in the driver, in every Ray worker and in sglang's spawned scheduler processes, all of which start the
venv's interpreter with that variable inherited. It imports nothing heavy at interpreter start: a patch module (and
torch, verl, sglang through it) is imported only when its target module is imported anyway.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import threading
from types import ModuleType

from verl_cpu._guard import PatchError, installed_version

# target module -> patch modules applied (in order) right after the target's code has run, per installed verl version
# (the pinned stack's verl 0.7.1 with sglang 0.5.6.post2; the current stack's verl 0.9.1 with sglang 0.5.12).
PATCHES_BY_VERL: dict[str, dict[str, tuple[str, ...]]] = {
    "0.7.1": {
        "verl.utils.device": ("verl_cpu.torch_cpu_memory",),
        "verl.workers.fsdp_workers": ("verl_cpu.dist_backend", "verl_cpu.offload_pin_memory"),
        "sglang.srt.server_args": ("verl_cpu.sglang_device",),
        "sglang.srt.utils.common": ("verl_cpu.sharing_strategy",),
        "sglang.srt.utils.patch_torch": ("verl_cpu.sglang_reduce",),
    },
    "0.9.1": {
        "verl.plugin.platform.platform_manager": ("verl_cpu.cpu_platform",),
        "verl.utils.device": ("verl_cpu.torch_cpu_memory",),
        "verl.utils.distributed": ("verl_cpu.dist_backend",),
        "verl.workers.engine.fsdp.transformer_impl": ("verl_cpu.offload_pin_memory",),
        "sglang.srt.server_args": ("verl_cpu.sglang_device",),
        "sglang.srt.utils.common": ("verl_cpu.sharing_strategy",),
        "sglang.srt.utils.patch_torch": ("verl_cpu.sglang_reduce",),
    },
}


def patches_for(verl_version: str) -> dict[str, tuple[str, ...]]:
    """The patch table of this verl version; refuses any other (naming the supported ones)."""
    if verl_version not in PATCHES_BY_VERL:
        raise PatchError(
            f"verl_cpu: no CPU patches for verl {verl_version}; written for verl {' / '.join(PATCHES_BY_VERL)}. "
            "Unset TREETUNE_VERL_CPU_PATCHES or update tools/cpu_shims/verl_cpu."
        )
    return PATCHES_BY_VERL[verl_version]


# Bench only (``bench_e2e_overhead.py --fixed-length``, both arms alike; never a training run): responses of fixed
# length, so that two runs time the same work. Added to the table only when its switch is set.
BENCH_PATCHES: dict[str, tuple[str, ...]] = {"sglang.srt.sampling.sampling_params": ("verl_cpu.bench_fixed_length",)}
BENCH_SWITCH = "TREETUNE_BENCH_FIXED_LENGTH"

PATCHES: dict[str, tuple[str, ...]] = patches_for(installed_version("verl"))  # the installed verl's table
if os.environ.get(BENCH_SWITCH) == "1":
    PATCHES = {**PATCHES, **BENCH_PATCHES}

_lock = threading.RLock()


def apply_patches(target: str, module: ModuleType) -> None:
    """Apply every patch registered for ``target`` to ``module`` (each patch is idempotent)."""
    for name in PATCHES[target]:
        importlib.import_module(name).apply(module)


class _PatchingLoader(importlib.abc.Loader):
    """Wraps the target's real loader: runs the module, then its patches. Everything else goes to the real loader."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        apply_patches(module.__name__, module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class PatchFinder(importlib.abc.MetaPathFinder):
    """Finds a target module through the other finders and wraps its loader; ignores every other module."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and not isinstance(spec.loader, _PatchingLoader):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def installed() -> bool:
    return any(isinstance(finder, PatchFinder) for finder in sys.meta_path)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once) and patch the targets that are already imported."""
    with _lock:
        if not installed():
            sys.meta_path.insert(0, PatchFinder())
        for target in PATCHES:
            module = sys.modules.get(target)
            if module is not None:
                apply_patches(target, module)
