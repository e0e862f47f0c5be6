# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Unknown keys in a settings mapping: one check, one message, naming the key and the closest valid one.

A typo in a Hydra override (``custom.entropy.top_kk=20``) must stop the run at start-up, not run it with the default
(``top_k`` = 0, the full vocabulary) and report numbers for settings the user did not ask for. Used by every reader
of our ``rollout.custom.*`` sections (``trainer/custom_keys.py`` checks them all at start-up).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

# difflib's ratio above which a name counts as a misspelling of another (``top_kk`` / ``top_k`` 0.91,
# ``entropy_forcast`` / ``entropy_forecast`` 0.97, ``every`` / ``seed`` 0.44).
CLOSE_MATCH = 0.6


def plain(value: Any) -> Any:
    """A settings section as plain containers (an OmegaConf ``DictConfig`` resolved to a dict; anything else as is)."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def closest(name: str, known: Iterable[str], cutoff: float = CLOSE_MATCH) -> str | None:
    """The known name most like ``name`` (difflib's ratio >= ``cutoff``), or ``None``."""
    matches = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=cutoff)
    return matches[0] if matches else None


def unknown_key_message(where: str, key: Any, known: Iterable[str]) -> str:
    """``<where>.<key>: unknown key; did you mean '<closest>'? (known: [...])``."""
    known = sorted(known)
    guess = closest(key, known)
    hint = f"did you mean {guess!r}? " if guess is not None else ""
    return f"{where}.{key}: unknown key; {hint}(known: {known})"


def check_known_keys(section: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """Raise on the first key of ``section`` (in sorted order) not in ``known``.

    Args:
        section: a mapping of settings (a dict or an OmegaConf ``DictConfig``).
        known: the valid keys.
        where: the section's dotted path, for the message (``actor_rollout_ref.rollout.custom.entropy``).

    Raises:
        ValueError: naming ``<where>.<key>``, the closest valid key and all of them.
    """
    known = set(known)
    unknown = sorted(str(key) for key in section if key not in known)
    if unknown:
        raise ValueError(unknown_key_message(where, unknown[0], known))
