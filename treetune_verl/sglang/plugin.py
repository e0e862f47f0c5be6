# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Our ``sglang.srt.plugins`` entry point (``pyproject.toml``): sglang >= 0.5.12 runs :func:`load` in every process
that calls its ``load_plugins()`` — the parent's Engine and, first thing, each spawned scheduler process.

Inert unless ``TREETUNE_ENTROPY=1`` (exported by ``treetune_verl.sglang.engine.install``, or set by hand before
starting sglang, e.g. ``python -m sglang.launch_server``): then it applies the version's hooks with the configuration
read from the environment. sglang logs and swallows a plugin's exception, so a refusal here is also logged as ours;
``install()`` runs the same checks in the parent before anything is spawned, where they raise.
"""

from __future__ import annotations

import logging

from treetune_verl.sglang.config import EntropyConfig, enabled_in_env

logger = logging.getLogger(__name__)


def load() -> None:
    if not enabled_in_env():
        return
    try:
        from treetune_verl.sglang.patching import check_sglang_version
        from treetune_verl.sglang.v0_5_12.launch import apply_in_process

        check_sglang_version()
        apply_in_process(EntropyConfig.from_env())
    except Exception:
        logger.exception("treetune entropy: the sglang plugin could not apply its hooks; no entropy in this process")
        raise
