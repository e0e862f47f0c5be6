# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Guards shared by every sglang patch: pinned version, exact wrapped signatures, idempotent replacement.

A patch replaces exactly one upstream attribute, keeps the original on the replacement (``__treetune_original__``)
and refuses to run against anything but the version and signatures it was written for: these patches reach into
sglang internals that change between releases, and a silent no-op would return wrong or missing entropy. The
replacement mechanics are the package's shared ones (``treetune_verl/patching.py``); the version and the error are
sglang's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from treetune_verl.patching import ORIGINAL_ATTR, is_patched, original_of, replace_attr, signature_mismatch

__all__ = [
    "ENV_ALLOW_UNSUPPORTED",
    "ORIGINAL_ATTR",
    "SUPPORTED_SGLANG_VERSIONS",
    "UnsupportedSGLangError",
    "check_sglang_version",
    "check_signature",
    "is_patched",
    "original_of",
    "replace_attr",
]

SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.6.post2",)
# Escape hatch for trying a newer sglang at one's own risk; signature checks still run.
ENV_ALLOW_UNSUPPORTED = "TREETUNE_ALLOW_UNSUPPORTED_SGLANG"


class UnsupportedSGLangError(RuntimeError):
    """The installed sglang is not one the entropy patches were written and tested for."""


def check_sglang_version() -> str:
    """Return the installed sglang version, or raise naming the supported ones."""
    import sglang

    version = getattr(sglang, "__version__", "unknown")
    if version not in SUPPORTED_SGLANG_VERSIONS and os.environ.get(ENV_ALLOW_UNSUPPORTED) != "1":
        raise UnsupportedSGLangError(
            f"treetune_verl's sglang entropy patches support sglang {', '.join(SUPPORTED_SGLANG_VERSIONS)}; "
            f"found {version}. Install sglang==0.5.6.post2 (set {ENV_ALLOW_UNSUPPORTED}=1 to try anyway)."
        )
    return version


def check_signature(fn: Callable[..., Any], expected: Sequence[str], where: str) -> None:
    """Raise unless ``fn`` takes exactly the parameters ``expected`` (names, in order)."""
    found = signature_mismatch(fn, expected)
    if found is not None:
        raise UnsupportedSGLangError(
            f"{where} has signature {found}, expected {tuple(expected)} (sglang "
            f"{', '.join(SUPPORTED_SGLANG_VERSIONS)}): the entropy patch for it would be wrong. "
            "Install sglang==0.5.6.post2."
        )
