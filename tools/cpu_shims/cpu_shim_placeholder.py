# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Shared helper of the CPU import shims: placeholders that fail loudly when actually used."""

import importlib.abc
import importlib.machinery
import sys
import types
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


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import <package>.<anything>`` that has no file in the shim a module whose every name is a placeholder.

    Appended to ``sys.meta_path`` after the path finder, so submodules the shim really ships (with real names in them)
    still load from their files."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = placeholder_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


def install_submodule_finder(package: str) -> None:
    """Every not-shipped submodule of ``package`` imports as placeholders (idempotent)."""
    if not any(isinstance(f, _SubmoduleFinder) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_SubmoduleFinder(package))
