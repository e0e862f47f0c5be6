# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Shared helper of the CPU import shims: placeholders that fail loudly when actually used."""

from collections.abc import Callable


class Unavailable:
    """Stands in for a GPU kernel that sglang imports but never calls on CPU; raises if called."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._qualname} is a CPU import shim (tools/cpu_shims): the real GPU kernel is not installed. "
            "This code path needs a CUDA install of sglang."
        )

    def __getattr__(self, name: str) -> "Unavailable":
        if name.startswith("__"):
            raise AttributeError(name)
        return Unavailable(f"{self._qualname}.{name}")

    def __repr__(self) -> str:
        return f"<cpu shim placeholder {self._qualname}>"


def placeholder_getattr(module_name: str) -> Callable[[str], Unavailable]:
    """A module-level ``__getattr__`` that resolves every public name of ``module_name`` to a placeholder."""

    def __getattr__(name: str) -> Unavailable:
        if name.startswith("__"):
            raise AttributeError(name)
        return Unavailable(f"{module_name}.{name}")

    return __getattr__
