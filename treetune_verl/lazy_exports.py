# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""A package's public names imported on first use (PEP 562), so that importing one light module of a package does
not import the package's verl-version-specific modules. A shared leaf: imports nothing of the package."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` giving ``name`` from module ``where[name]`` on first access."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__
