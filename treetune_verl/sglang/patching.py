# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""sglang as an :class:`~treetune_verl.patching.Upstream`: the pinned version and the error every sglang patch raises.

These patches reach into sglang internals that change between releases, and a silent no-op would return wrong or
missing entropy, so each one goes through :data:`SGLANG`'s ``require`` and ``wrap`` (or ``check_signature``): the
mechanics are the package's one mechanism (``treetune_verl/patching.py``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from treetune_verl.patching import (
    ORIGINAL_ATTR,
    Replace,
    Upstream,
    Wrap,
    is_patched,
    is_replaced,
    original_of,
    replace_attr,
    takes,
    upstream_value,
)

__all__ = [
    "ENV_ALLOW_UNSUPPORTED",
    "ORIGINAL_ATTR",
    "SGLANG",
    "Replace",
    "SUPPORTED_SGLANG_VERSIONS",
    "UnsupportedSGLangError",
    "Wrap",
    "check_sglang_version",
    "check_signature",
    "installed_sglang_version",
    "is_patched",
    "is_replaced",
    "original_of",
    "replace_attr",
    "takes",
    "upstream_value",
]

SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.6.post2", "0.5.12")  # pinned stack, current stack
# Escape hatch for trying a newer sglang at one's own risk; signature checks still run.
ENV_ALLOW_UNSUPPORTED = "TREETUNE_ALLOW_UNSUPPORTED_SGLANG"


class UnsupportedSGLangError(RuntimeError):
    """The installed sglang is not one the entropy patches were written and tested for."""


SGLANG = Upstream("sglang", SUPPORTED_SGLANG_VERSIONS, UnsupportedSGLangError, allow_env=ENV_ALLOW_UNSUPPORTED)
check_signature = SGLANG.check_signature


def installed_sglang_version() -> str | None:
    """The installed sglang's version from its package metadata (no import of sglang); ``None`` if absent."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def check_sglang_version() -> str:
    """Return the installed sglang version, or raise naming the supported ones."""
    return SGLANG.require("sglang entropy patches")
