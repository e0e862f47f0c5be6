# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What verl's agent-loop registry says of a loop, read by both verl versions' workers (``verl/v0_*/``)."""

from __future__ import annotations

import functools


@functools.cache
def is_managed(agent_name: str) -> bool:
    """Whether verl's registry entry for ``agent_name`` is a loop that returns a session's rows (the managed loop:
    ``returns_session_rows``; named by attribute, as ``managed`` is a layer above this one)."""
    from hydra.utils import get_class
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    target = (_agent_loop_registry.get(agent_name) or {}).get("_target_")
    return target is not None and getattr(get_class(target), "returns_session_rows", False)
