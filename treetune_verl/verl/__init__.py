# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl's side of what differs between verl versions: one folder per version (``v0_7_1/``, ``v0_9_1/``), picked
through one table (:data:`ADAPTERS`), as ``treetune_verl/sglang/`` does for sglang.

Each version's folder has the same modules, with the same names and functions; code above it asks for one by name
(:func:`adapter`), never for a version. Dropping a verl version is deleting its folder and its row.

Both folders have:

- ``process_setup``: what the entry point :mod:`treetune_verl.verl.process_setup` (verl's ``external_lib``) installs
  in verl's processes;
- ``entropy_manager`` (``EntropyAgentLoopManager``, the block's ``agent_loop_manager_class``), ``worker`` (every
  worker-side feature in one agent-loop worker), ``entropy_tool_agent_loop`` (``EntropyToolAgentLoop``),
  ``over_sample_worker``, ``session_rows_worker``, ``forecast_eval_worker``;
- ``trainer_seams`` and ``actor_seams``: every hook in verl's trainer and actor processes;
- ``generation_rollout``: the generation job's rollout (``backend=verl``).

verl 0.7.1 has ``trainer_setup`` (the manager installs the trainer's seams), ``session_server_manager`` and
``carry_over_worker``; verl 0.9.1 (its V1 trainer on TransferQueue) has ``entropy_rows``, ``over_sample_sampler``,
``resuming_client``, ``rollout_eval`` (E through TransferQueue) and ``engine_forecast``. The names users write in
their configs are this package's (:data:`PUBLIC`): ``treetune_verl.verl.EntropyAgentLoopManager``,
``treetune_verl.verl.EntropyToolAgentLoop``, ``treetune_verl.verl.process_setup``. Layout:
``treetune_specs/2026-11-28-house-settings-and-stacks.md``.
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
