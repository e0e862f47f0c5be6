# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl as an :class:`~treetune_verl.patching.Upstream`: the pinned version and the error every verl patch raises.

Each verl-side seam (``treetune_verl/trainer/``, the registered estimators that wrap verl's own) calls
:func:`require_verl` and wraps through :data:`VERL`, so an unsupported verl fails loudly naming the supported versions
instead of computing something silently wrong. A shared leaf: imports only ``treetune_verl.patching``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from treetune_verl.patching import Upstream

SUPPORTED_VERL_VERSIONS: tuple[str, ...] = ("0.7.1",)
CURRENT_VERL_VERSIONS: tuple[str, ...] = ("0.9.1",)  # the current stack's V1 trainer (treetune_verl/verl/v0_9_1)


class UnsupportedVerlError(RuntimeError):
    """The installed verl is not one the treetune_verl patches were written for."""


VERL = Upstream("verl", SUPPORTED_VERL_VERSIONS, UnsupportedVerlError)
VERL_CURRENT = Upstream("verl", CURRENT_VERL_VERSIONS, UnsupportedVerlError)  # the seams of verl 0.9.1's trainer
check_signature = VERL.check_signature


def installed_verl_version() -> str:
    """The installed verl's version from its package metadata (no import of verl)."""
    return version("verl")


def require_verl(what: str) -> None:
    """Raise :class:`UnsupportedVerlError` unless the installed verl is a supported version (``what`` names the
    patch for the message, e.g. ``"trainer hooks"``)."""
    VERL.require(what)


def undecorated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function under verl's ``GPUMemoryLogger`` decorator (``verl/utils/profiler``), which hides its signature
    (no ``functools.wraps``): what a signature check must look at; any other function as it is."""
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    if "decorated_function" in names:
        return fn.__closure__[names.index("decorated_function")].cell_contents
    return fn
