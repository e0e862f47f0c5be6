# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The mechanics every upstream patch shares: exact-signature checks and idempotent one-attribute replacement.

A patch replaces exactly one upstream attribute and keeps the original on the replacement
(``__treetune_original__``), so a second application is a no-op and tests can restore upstream. Which versions a
patch supports, and the error it raises, belong to each side: ``treetune_verl.sglang.patching`` (sglang 0.5.6.post2)
and ``treetune_verl.agent_loop.trainer_hooks`` (verl 0.7.1). A shared leaf: imports nothing of the package.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

ORIGINAL_ATTR = "__treetune_original__"


def original_of(fn: Any) -> Any:
    """The upstream object behind a patched attribute (``fn`` itself if unpatched)."""
    return getattr(fn, ORIGINAL_ATTR, fn)


def signature_mismatch(fn: Callable[..., Any], expected: Sequence[str]) -> tuple[str, ...] | None:
    """``None`` when the upstream function behind ``fn`` takes exactly ``expected`` (names, in order), else what it
    takes."""
    found = tuple(inspect.signature(original_of(fn)).parameters)
    return None if found == tuple(expected) else found


def is_patched(owner: Any, name: str) -> bool:
    return hasattr(getattr(owner, name, None), ORIGINAL_ATTR)


def replace_attr(owner: Any, name: str, make_replacement: Callable[[Any], Any]) -> None:
    """Set ``owner.name = make_replacement(original)`` once; a second call is a no-op (idempotent)."""
    if is_patched(owner, name):
        return
    original = getattr(owner, name)
    replacement = make_replacement(original)
    setattr(replacement, ORIGINAL_ATTR, original)
    setattr(owner, name, replacement)
