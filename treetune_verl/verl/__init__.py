# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl's side of what differs between verl versions: one folder per version (``v0_7_1/``, ``v0_9_1/``), picked
through one table (:data:`ADAPTERS`), as ``treetune_verl/sglang/`` does for sglang.

Each version's folder has the same modules, with the same names and functions; code above it asks for one by name
(:func:`adapter`), never for a version. Dropping a verl version is deleting its folder and its row.

Today the folders hold the generation job's rollout (``generation_rollout``: verl's agent-loop manager in standalone
mode with the entropy worker, for ``backend=verl``). The other modules only one verl needs (``agent_loop/*_tq.py``,
``verl/v0_9_1/``, the pinned-only agent-loop modules and seams) move here next (issue 47;
``treetune_specs/2026-11-28-house-settings-and-stacks.md``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from treetune_verl.verl_guard import (
    CURRENT_VERL_VERSIONS,
    SUPPORTED_VERL_VERSIONS,
    UnsupportedVerlError,
    installed_verl_version,
)

# verl version -> its adapter folder, for every version verl_guard supports (one list of them: its own)
ADAPTERS = {
    version: f"{__name__}.v{version.replace('.', '_')}" for version in SUPPORTED_VERL_VERSIONS + CURRENT_VERL_VERSIONS
}


def adapter(module: str) -> ModuleType:
    """The installed verl's ``module`` (e.g. ``"generation_rollout"``) from its folder.

    Raises:
        UnsupportedVerlError: the installed verl has no folder (naming the supported versions).
    """
    version = installed_verl_version()
    if version not in ADAPTERS:
        raise UnsupportedVerlError(
            f"treetune_verl's verl adapters support verl {' or '.join(ADAPTERS)}; verl {version} is installed"
        )
    return importlib.import_module(f"{ADAPTERS[version]}.{module}")


# Public name -> the adapter module that defines it for the installed verl (imported on first use, PEP 562).
PUBLIC = {"EntropyAgentLoopManager": "entropy_manager", "EntropyToolAgentLoop": "entropy_tool_agent_loop"}


def __getattr__(name: str) -> type:
    if name not in PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(adapter(PUBLIC[name]), name)
