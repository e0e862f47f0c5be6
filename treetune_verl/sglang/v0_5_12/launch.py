# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``install`` on sglang 0.5.12: switch the plugin on for spawned processes, hook the TokenizerManager here.

Nothing of sglang's launch is replaced. ``install`` checks that sglang will load our plugin in the scheduler
process (entry point registered, not excluded by ``SGLANG_PLUGINS``), exports the configuration with
``TREETUNE_ENTROPY=1`` (inherited by the scheduler processes, where ``plugin.load`` reads it), and applies the
parent's hooks. ``apply_in_process`` is what the plugin runs in every process sglang loads it in.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import UnsupportedSGLangError, is_patched
from treetune_verl.sglang.tokenizer_patches import apply_tokenizer_patches
from treetune_verl.sglang.v0_5_12.scheduler_hooks import apply_scheduler_hooks
from treetune_verl.sglang.v0_5_12.tokenizer_hooks import apply_tokenizer_hooks

PLUGIN_GROUP = "sglang.srt.plugins"  # sglang 0.5.12 srt/plugins/__init__.py GENERAL_PLUGINS_GROUP
PLUGIN_NAME = "treetune_entropy"  # our entry point's name in pyproject.toml
ENV_SGLANG_PLUGINS = "SGLANG_PLUGINS"  # sglang's allow-list of plugin names (empty: all)


def check_plugin_reaches_scheduler() -> None:
    """Raise unless sglang's ``load_plugins()`` in a spawned scheduler will run our entry point."""
    if not [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]:
        raise UnsupportedSGLangError(
            f"treetune entropy on sglang 0.5.12 runs as the sglang plugin {PLUGIN_NAME!r} ({PLUGIN_GROUP} entry "
            "point), which is not registered: install treetune-verl as a package (pip install -e .), not only on "
            "sys.path."
        )
    allowed = os.environ.get(ENV_SGLANG_PLUGINS, "").strip()
    if allowed and PLUGIN_NAME not in {name.strip() for name in allowed.split(",")}:
        raise UnsupportedSGLangError(
            f"{ENV_SGLANG_PLUGINS}={allowed!r} excludes the plugin {PLUGIN_NAME!r}: sglang's scheduler would run "
            f"without entropy. Add {PLUGIN_NAME} to {ENV_SGLANG_PLUGINS} or unset it."
        )


def apply_in_process(config: EntropyConfig) -> None:
    """Every hook of this version in the current process (idempotent): the scheduler's and the parent's."""
    apply_scheduler_hooks(config)
    apply_tokenizer_patches()
    apply_tokenizer_hooks()


def install(config: EntropyConfig) -> None:
    check_plugin_reaches_scheduler()
    apply_in_process(config)
    config.export()  # last: the scheduler processes are switched on only once everything here is in place


def is_installed() -> bool:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    return is_patched(TokenizerManager, "_handle_batch_output")
