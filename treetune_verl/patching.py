# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The one mechanism every upstream patch goes through: wrap an upstream attribute, guarded, idempotent, restorable.

An :class:`Upstream` is a package we patch (sglang, verl) with the versions our patches were written for and the
error they raise. :meth:`Upstream.wrap` replaces exactly one attribute after checking the exact signature of what it
wraps, keeps the original on the replacement (``__treetune_original__``) so that a second application is a no-op and
:func:`restore` puts upstream back. :func:`swapped` is the same for an instance attribute set for the duration of
one call (restored also on exceptions). The instances live with their side: ``treetune_verl.sglang.patching.SGLANG``
and ``treetune_verl.verl_guard.VERL``. A shared leaf: imports nothing of the package.

The one exception to wrapping is :class:`Replace`, through :meth:`Upstream.replace`: an attribute set to a value of
ours where nothing of the original runs through it (a whole entry point, a second name of a class already wrapped,
upstream data extended), checked first, idempotent and restorable the same way.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterator, MutableMapping, Sequence
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


def takes(*params: str) -> Callable[[Any], str | None]:
    """A :class:`Replace`'s ``expect`` for a callable: upstream's takes exactly ``params`` (names, in order)."""

    def expect(fn: Any) -> str | None:
        found = signature_mismatch(fn, params)
        return None if found is None else f"has signature {found}, expected {params}"

    return expect


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


# What each Replace set: per owner, attribute (or key) -> (upstream's value, ours). Kept in an attribute owner's own
# ``__dict__`` (never inherited, gone with the owner); a mapping owner (a registry) is a module's and lives as long.
REPLACED_ATTR = "__treetune_replaced__"
_MAPPING_RECORDS: dict[int, tuple[MutableMapping[str, Any], dict[str, tuple[Any, Any]]]] = {}


class _Absent:
    """Upstream's value of a mapping key that did not exist (``restore`` deletes the key)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


def _records(owner: Any, create: bool = False) -> dict[str, tuple[Any, Any]]:
    if isinstance(owner, MutableMapping):
        if create:
            _MAPPING_RECORDS.setdefault(id(owner), (owner, {}))
        return _MAPPING_RECORDS.get(id(owner), (owner, {}))[1]
    if create and REPLACED_ATTR not in vars(owner):
        setattr(owner, REPLACED_ATTR, {})
    return vars(owner).get(REPLACED_ATTR, {})


def _read(owner: Any, name: str) -> Any:
    if isinstance(owner, MutableMapping):
        return owner.get(name, ABSENT)
    return getattr(owner, name)


def _write(owner: Any, name: str, value: Any) -> None:
    if not isinstance(owner, MutableMapping):
        setattr(owner, name, value)
    elif value is ABSENT:
        del owner[name]
    else:
        owner[name] = value


def upstream_value(owner: Any, name: str) -> Any:
    """``owner.name`` as upstream has it: the original behind our :class:`Replace` or :class:`Wrap`, else itself."""
    record = _records(owner).get(name)
    if record is not None and _read(owner, name) is record[1]:
        return record[0]
    return original_of(_read(owner, name))


def is_replaced(owner: Any, name: str) -> bool:
    """Whether ``owner.name`` (``owner[name]`` for a mapping) is still the value a :class:`Replace` set."""
    record = _records(owner).get(name)
    return record is not None and _read(owner, name) is record[1]


def restore(owner: Any, name: str) -> None:
    """Put upstream's ``owner.name`` back, wrapped or replaced (no-op when neither)."""
    if is_replaced(owner, name):
        original, _ = _records(owner).pop(name)
        _write(owner, name, original)
    elif not isinstance(owner, MutableMapping) and is_patched(owner, name):
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

    def replace(self, *replacements: Replace) -> None:
        """Check every upstream value first (nothing is set when one differs from what its replacement was written
        for), then set each ``owner.name = make_value(original)`` once (idempotent: a second call finds ours)."""
        pending = [r for r in replacements if not is_replaced(r.owner, r.name)]
        for r in pending:
            problem = r.expect(_read(r.owner, r.name))
            if problem is not None:
                raise self.error(
                    f"{self.package} {r.where or r.name}: {problem} ({self.package} {self.versions}): the treetune "
                    f"replacement for it would be wrong. {self.install_hint}"
                )
        for r in pending:
            original = _read(r.owner, r.name)
            value = r.make_value(original)
            _records(r.owner, create=True)[r.name] = (original, value)
            _write(r.owner, r.name, value)


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


@dataclass(frozen=True)
class Replace:
    """One upstream attribute set to a value of ours where a wrapper cannot do: ``owner.name`` (``owner[name]`` when
    ``owner`` is a mapping: a registry; :data:`ABSENT` stands for a key it lacks) becomes ``make_value(original)``,
    and nothing of the original runs through ours.

    The one named exception to :class:`Wrap`; ``why`` says which case it is: a whole entry point of ours in place of
    upstream's, a second name bound to a class already wrapped, or upstream data extended (a tuple of key names, a
    registry's entries), or an attribute of our own subclass's instance put behind a proxy. ``expect(original)``:
    ``None`` when upstream's value is what ``make_value`` was written for, else what differs (the role of a
    ``Wrap``'s signature check); ``where`` names it in errors (default ``name``).
    """

    owner: Any
    name: str
    make_value: Callable[[Any], Any]
    expect: Callable[[Any], str | None]
    why: str
    where: str | None = None

    def __post_init__(self) -> None:
        if not self.why.strip():
            raise ValueError(f"Replace of {self.name!r}: say why it is not a Wrap")
