# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the server tests: what verl's sglang server changes in this process, put back."""

from __future__ import annotations

import os

import pytest

from treetune_verl.sglang.config import ENV_ENABLED, ENV_MODE, ENV_TOP_K


@pytest.fixture(autouse=True, scope="module")
def sglang_engine_setup_restored():
    """Importing verl's sglang server replaces sglang's ``engine._set_envs_and_config`` process-wide (verl 0.7.1
    ``workers/rollout/sglang_rollout/sglang_rollout.py``, at import) and sets ``SGLANG_USE_CPU_ENGINE=1``
    (``workers/rollout/replica.py`` ``_load_sglang``): put both back after each module, so the Engine tests that run
    later in the session see sglang as shipped."""
    from sglang.srt.entrypoints import engine

    original = engine._set_envs_and_config
    use_cpu_engine = os.environ.get("SGLANG_USE_CPU_ENGINE")
    yield
    engine._set_envs_and_config = original
    if use_cpu_engine is None:
        os.environ.pop("SGLANG_USE_CPU_ENGINE", None)
    else:
        os.environ["SGLANG_USE_CPU_ENGINE"] = use_cpu_engine


@pytest.fixture
def isolated_env(monkeypatch):
    """verl's server sets CUDA_VISIBLE_DEVICES and sglang env flags in this process, ``install()`` our switch and
    settings (``treetune_verl.sglang.config``); restore them afterwards."""
    for key in ("CUDA_VISIBLE_DEVICES", "SGLANG_BLOCK_NONZERO_RANK_CHILDREN", ENV_TOP_K):
        monkeypatch.setenv(key, os.environ.get(key, ""))
    for key in (ENV_ENABLED, ENV_MODE):
        monkeypatch.delenv(key, raising=False)
