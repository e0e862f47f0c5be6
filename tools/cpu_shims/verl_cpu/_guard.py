# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Guards shared by the patches: installed versions, exact signatures, CPU only, and the mark that makes them idempotent."""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable
from typing import Any

# Set on every replacement (value: the patch's module name); ``__wrapped__`` holds the original.
MARK = "__treetune_verl_cpu_patch__"


class PatchError(RuntimeError):
    """A CPU patch cannot be applied safely (unsupported version, changed upstream signature, CUDA present)."""


def installed_version(distribution: str) -> str:
    """The installed version of ``distribution`` (from its metadata: no import, safe during a half-done import)."""
    return importlib.metadata.version(distribution)


def require_versions(patch: str, supported: dict[str, tuple[str, ...]]) -> None:
    """Raise unless every distribution's installed version (local part ignored: ``2.13.0+cpu``) is supported."""
    for distribution, versions in supported.items():
        found = installed_version(distribution)
        if found not in versions and found.split("+")[0] not in versions:
            raise PatchError(
                f"verl_cpu.{patch}: written for {distribution} {' / '.join(versions)}, but {distribution} {found} "
                f"is installed (supported set: {_describe(supported)}). Re-check the upstream code this patch "
                "replaces and update tools/cpu_shims/verl_cpu."
            )


def require_signature(patch: str, func: Callable[..., Any], expected: Iterable[str], where: str) -> None:
    """Raise unless ``func``'s parameter names are exactly ``expected`` (the upstream function the patch replaces)."""
    expected = tuple(expected)
    found = tuple(inspect.signature(func).parameters)
    if found != expected:
        raise PatchError(
            f"verl_cpu.{patch}: {where} has parameters {found}, the patch was written for {expected}. The upstream "
            "function changed; re-check it and update tools/cpu_shims/verl_cpu."
        )


def require_cpu_only(patch: str) -> None:
    """Raise on a machine where torch sees CUDA: these patches must never be active on a GPU install."""
    import torch

    if torch.cuda.is_available():
        raise PatchError(
            f"verl_cpu.{patch}: CUDA is available. The CPU patches must not be active on a GPU machine; unset "
            "TREETUNE_VERL_CPU_PATCHES (a GPU install does not run tools/cpu_env/setup.sh)."
        )


def is_patched(obj: object) -> bool:
    return getattr(obj, MARK, None) is not None


def replacement_of(original: Callable[..., Any], patch: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``functools.wraps(original)`` (keeps the original as ``__wrapped__``) plus the patch mark."""

    def decorate(replacement: Callable[..., Any]) -> Callable[..., Any]:
        functools.wraps(original)(replacement)
        setattr(replacement, MARK, patch)
        return replacement

    return decorate


def _describe(supported: dict[str, tuple[str, ...]]) -> str:
    return ", ".join(f"{name} {' / '.join(versions)}" for name, versions in supported.items())
