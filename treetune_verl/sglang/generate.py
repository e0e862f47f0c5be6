# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Deprecated (one release): ``make run``'s job is :mod:`treetune_verl.generation.quick_run`.

``python -m treetune_verl.sglang.generate [options]`` warns and runs ``python -m treetune_verl.generation.quick_run
[options]``; importing this module warns, and its old names (``main``, ``parse_args``, ``load_prompts``,
``quiet_known_notices``, ``BUILTIN_PROMPTS``) still resolve to that module's. The new module is imported through
``importlib`` by name, only when needed: the generation layer comes after this one, and only this alias reaches up
to it.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Any

NEW_MODULE = "treetune_verl.generation.quick_run"
_MOVED = ("BUILTIN_PROMPTS", "load_prompts", "main", "parse_args", "quiet_known_notices")
__all__ = list(_MOVED)


def _new_module() -> ModuleType:
    return importlib.import_module(NEW_MODULE)


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return getattr(_new_module(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MOVED))


if __name__ == "__main__":
    warnings.warn(
        f"python -m treetune_verl.sglang.generate is deprecated and goes in 0.2: run python -m {NEW_MODULE} "
        "(make run), same options",
        DeprecationWarning,
        stacklevel=1,  # attributed to __main__, so it shows under Python's default warning filters
    )
    _new_module().main()
else:
    warnings.warn(
        f"treetune_verl.sglang.generate is deprecated and goes in 0.2: import from {NEW_MODULE}",
        DeprecationWarning,
        stacklevel=2,
    )
