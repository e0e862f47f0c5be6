# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The installed sglang's torch sampler as a copy that also returns its weights (``v0_5_*/support_sampling.py``),
refused unless upstream's function is exactly the one it was copied from (issue 48, engine side).

A copy is the one way to read the support sglang's sampler draws from without sorting the vocabulary twice (the
version modules say why); a copy that drifts from upstream would record one support and sample from another, so it
is checked by the hash of upstream's source, not only its signature.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from treetune_verl.sglang.patching import SGLANG, check_sglang_version, original_of, upstream_value

UPSTREAM = "sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch"
# The copy of each supported sglang version (a newer one let through by the escape hatch is checked against 0.5.12's,
# as ``engine.py`` hands it 0.5.12's adapter; the source hash then refuses it unless upstream's function is unchanged).
_COPIES = {"0.5.6.post2": "treetune_verl.sglang.v0_5_6_post2.support_sampling"}
_NEWEST_COPY = "treetune_verl.sglang.v0_5_12.support_sampling"


def source_sha256(fn: Callable[..., Any]) -> str:
    """The sha256 of the source of the upstream function behind ``fn``."""
    return hashlib.sha256(inspect.getsource(original_of(fn)).encode()).hexdigest()


def upstream_source_problem(fn: Callable[..., Any], expected_sha256: str) -> str | None:
    """``None`` when upstream's function is the one the copy was made from, else what differs."""
    found = source_sha256(fn)
    return None if found == expected_sha256 else f"has source sha256 {found}, the copy was made from {expected_sha256}"


def installed_copy() -> ModuleType:
    """The installed version's copy module (``sample_with_support``, ``UPSTREAM_SOURCE_SHA256``), after checking
    that upstream's function is the one it was copied from.

    Raises:
        UnsupportedSGLangError: another sglang version, or upstream's function changed (naming the versions).
    """
    copy = importlib.import_module(_COPIES.get(check_sglang_version(), _NEWEST_COPY))
    from sglang.srt.layers import sampler

    upstream = upstream_value(sampler, UPSTREAM.rsplit(".", 1)[1])  # also once ours is bound in its name
    problem = upstream_source_problem(upstream, copy.UPSTREAM_SOURCE_SHA256)
    if problem is not None:
        raise SGLANG.error(
            f"{UPSTREAM} {problem} (sglang {SGLANG.versions}): the sampled support would not be the one it samples "
            f"from. {SGLANG.install_hint}"
        )
    return copy


def sample_with_support() -> Callable[..., tuple[Any, Any, Any]]:
    """The installed version's ``sample_with_support`` (same arguments as upstream's function; returns the ids, the
    sorted weights it drew from and their token ids); raises as :func:`installed_copy`."""
    return installed_copy().sample_with_support
