# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl's guards, shared by every patch on the verl side: the pinned version and exact-signature checks.

Each verl-side patch (trainer hooks, the actor's loss aggregation, registered estimators that wrap verl's own) calls
:func:`require_verl` and :func:`check_signature` before it replaces anything, so an unsupported verl fails loudly
naming the supported versions instead of computing something silently wrong. A shared leaf: imports only
``treetune_verl.patching`` (and verl, lazily).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from treetune_verl.patching import signature_mismatch

SUPPORTED_VERL_VERSIONS: tuple[str, ...] = ("0.7.1",)


class UnsupportedVerlError(RuntimeError):
    """The installed verl is not one the treetune_verl patches were written for."""


def require_verl(what: str) -> None:
    """Raise :class:`UnsupportedVerlError` unless the installed verl is a supported version.

    ``what`` names the patch for the message (e.g. ``"trainer hooks"``).
    """
    import verl

    if verl.__version__ not in SUPPORTED_VERL_VERSIONS:
        raise UnsupportedVerlError(
            f"treetune_verl's {what} support verl {', '.join(SUPPORTED_VERL_VERSIONS)}; found {verl.__version__}. "
            "Install verl==0.7.1."
        )


def check_signature(fn: Callable[..., Any], expected: Sequence[str], where: str) -> None:
    """Raise :class:`UnsupportedVerlError` unless the upstream function behind ``fn`` takes exactly ``expected``."""
    found = signature_mismatch(fn, expected)
    if found is not None:
        raise UnsupportedVerlError(
            f"verl {where} has signature {found}, expected {tuple(expected)} (verl "
            f"{', '.join(SUPPORTED_VERL_VERSIONS)}): the treetune patch for it would be wrong. Install verl==0.7.1."
        )


def undecorated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function under verl's ``GPUMemoryLogger`` decorator (``verl/utils/profiler``), which hides its signature
    (no ``functools.wraps``): what ``check_signature`` must look at; any other function as it is."""
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    if "decorated_function" in names:
        return fn.__closure__[names.index("decorated_function")].cell_contents
    return fn
