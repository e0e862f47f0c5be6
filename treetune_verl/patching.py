# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The one mechanism every upstream patch goes through: wrap an upstream attribute, guarded, idempotent, restorable.

An :class:`Upstream` is a package we patch (sglang, verl) with the versions our patches were written for and the
error they raise. :meth:`Upstream.wrap` replaces exactly one attribute after checking the exact signature of what it
wraps, keeps the original on the replacement (``__treetune_original__``) so that a second application is a no-op and
:func:`restore` puts upstream back. :func:`swapped` is the same for an instance attribute set for the duration of
one call (restored also on exceptions). The instances live with their side: ``treetune_verl.sglang.patching.SGLANG``
and ``treetune_verl.verl_guard.VERL``. A shared leaf: imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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


def restore(owner: Any, name: str) -> None:
    """Put upstream's ``owner.name`` back (no-op when unpatched)."""
    if is_patched(owner, name):
        setattr(owner, name, original_of(getattr(owner, name)))


@contextlib.contextmanager
def swapped(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name = value`` as an instance attribute for the duration; afterwards the instance's own attribute as it
    was (deleted when it had none, so the class attribute shows again), also on exceptions."""
    own = vars(obj)
    had_own, previous = name in own, own.get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had_own:
            setattr(obj, name, previous)
        else:
            delattr(obj, name)


@dataclass(frozen=True)
class Upstream:
    """A package we patch: the versions the patches support and the error that names them.

    Args:
        package: import name and pip name (``sglang``, ``verl``).
        supported: versions the patches were written and tested for; the last is the one to install.
        error: raised on another version or a changed signature.
        allow_env: an environment variable that, set to ``1``, lets another version through (signatures are still
            checked); ``None``: no escape hatch.
    """

    package: str
    supported: tuple[str, ...]
    error: type[RuntimeError]
    allow_env: str | None = None

    @property
    def versions(self) -> str:
        return ", ".join(self.supported)

    @property
    def install_hint(self) -> str:
        return f"Install {self.package}=={self.supported[-1]}."

    def require(self, what: str) -> str:
        """The installed version, or raise naming ``what`` (e.g. ``"trainer hooks"``) and the supported versions."""
        version = getattr(importlib.import_module(self.package), "__version__", "unknown")
        allowed = self.allow_env is not None and os.environ.get(self.allow_env) == "1"
        if version not in self.supported and not allowed:
            escape = f" (set {self.allow_env}=1 to try anyway)" if self.allow_env else ""
            raise self.error(
                f"treetune_verl's {what} support {self.package} {self.versions}; found {version}. "
                f"{self.install_hint}{escape}"
            )
        return version

    def check_signature(self, fn: Callable[..., Any], expected: Sequence[str], where: str) -> None:
        """Raise unless the upstream function behind ``fn`` takes exactly ``expected`` (names, in order)."""
        found = signature_mismatch(fn, expected)
        if found is not None:
            raise self.error(
                f"{self.package} {where} has signature {found}, expected {tuple(expected)} ({self.package} "
                f"{self.versions}): the treetune patch for it would be wrong. {self.install_hint}"
            )

    def wrap(self, *wraps: Wrap) -> None:
        """Check every signature first (nothing is replaced when one differs), then replace each attribute once with
        ``make_wrapper(original)`` (idempotent)."""
        for w in wraps:
            self.check_signature(w.unwrap(original_of(getattr(w.owner, w.name))), w.params, w.where or w.name)
        for w in wraps:
            replace_attr(w.owner, w.name, w.make_wrapper)


def _itself(fn: Any) -> Any:
    return fn


@dataclass(frozen=True)
class Wrap:
    """One upstream attribute to wrap: ``owner.name`` becomes ``make_wrapper(original)``.

    ``params``: the exact parameter names upstream's function takes (the wrapper re-states them); ``where`` names it
    in errors (default ``name``); ``unwrap`` gives the function whose signature counts (e.g. the one under a decorator
    that hides it, or a class's method).
    """

    owner: Any
    name: str
    make_wrapper: Callable[[Any], Any]
    params: Sequence[str]
    where: str | None = None
    unwrap: Callable[[Any], Any] = _itself
