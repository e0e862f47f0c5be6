# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The rollout-entropy block in a stock ``python -m verl.trainer.main_ppo`` of verl 0.9.1 (its default V1 trainer on
TransferQueue, Ray, an FSDP2 engine-worker actor, our server over verl's sglang 0.5.12 server): the arguments of
``test_entropy_e2e.sh`` (``make e2e STACK=current``).

The GRPO runs themselves are in ``test_e2e_variants_on_cpu.py`` (the block with validation and forking tokens, two
processes, a reference model, a checkpoint and its resume; every step's rollout entropy against the actor's of the
same tokens), ``test_e2e_over_sample_on_cpu.py`` and ``test_e2e_managed_on_cpu.py``. A separate run of the block
alone would make no check the full variant's run does not (and cost CI two minutes).
"""

from __future__ import annotations

import importlib.metadata

import pytest

from treetune_tests.e2e.script import run_script

ACTOR_SETUP = "actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup"

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")


def test_the_block_names_the_actor_entry_point_on_verl_0_9_1(tmp_path):
    """verl 0.9.1 builds the servers before it loads the block's manager: the entry point selects the server."""
    env = {"E2E_MODEL": "tiny", "E2E_PRINT_ARGS": "1", "E2E_WORKDIR": str(tmp_path)}
    block = run_script(env, timeout=300)
    assert block.returncode == 0, block.stderr
    assert ACTOR_SETUP in block.stdout.splitlines() and "+treetune=rollout_entropy" in block.stdout.splitlines()
    stock = run_script({**env, "E2E_BLOCK": "0"}, timeout=300)
    assert stock.returncode == 0 and ACTOR_SETUP not in stock.stdout.splitlines()
