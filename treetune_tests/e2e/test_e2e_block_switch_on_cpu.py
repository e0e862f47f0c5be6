# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``E2E_BLOCK=0`` of ``test_entropy_e2e.sh`` (the stock arm of ``bench_e2e_overhead.py``), fast (``E2E_PRINT_ARGS=1``):
its arguments are exactly the block arm's minus the override block plus ``rollout.name=sglang`` and
``rollout.calculate_log_probs=True``, and Hydra composes them to verl's stock manager and loop with everything else
equal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from treetune_verl.config import read_overrides

REPO_ROOT = Path(__file__).resolve().parents[2]
E2E_SCRIPT = REPO_ROOT / "treetune_tests" / "e2e" / "test_entropy_e2e.sh"
STOCK_EXTRA = ["actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.calculate_log_probs=True"]


def _args(tmp_path: Path, device: str, **env: str) -> list[str]:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "E2E_PRINT_ARGS": "1",
        "E2E_DEVICE": device,
        "MODEL_PATH": str(tmp_path / "model"),  # only passed on: no model is built or read
        "E2E_WORKDIR": str(tmp_path / "work"),
        **env,
    }
    result = subprocess.run(["bash", str(E2E_SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _compose(overrides: list[str]):
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_stock_arm_is_the_block_arm_minus_the_block(tmp_path, device):
    block = read_overrides()
    with_block = _args(tmp_path, device)
    stock = _args(tmp_path, device, E2E_BLOCK="0")
    start = with_block.index(block[0])
    assert with_block[start : start + len(block)] == block
    assert stock == with_block[:start] + STOCK_EXTRA + with_block[start + len(block) :]
    assert not any(arg in stock for arg in block)

    from omegaconf import OmegaConf

    a, b = _compose(with_block), _compose(stock)
    ra, rb = a.actor_rollout_ref.rollout, b.actor_rollout_ref.rollout
    assert rb.name == ra.name == "sglang" and rb.calculate_log_probs is True and ra.calculate_log_probs is True
    assert rb.agent.get("agent_loop_manager_class") is None and rb.agent.default_agent_loop == "single_turn_agent"
    assert ra.agent.agent_loop_manager_class == "treetune_verl.verl.EntropyAgentLoopManager"
    assert "entropy" not in (rb.get("custom") or {}) and "treetune" not in b
    # Everything else composes to the same values (the block adds only the manager, the default loop and custom).
    da, db = OmegaConf.to_container(a, resolve=False), OmegaConf.to_container(b, resolve=False)
    for tree in (da, db):
        tree["actor_rollout_ref"]["rollout"]["agent"].pop("agent_loop_manager_class", None)
        tree["actor_rollout_ref"]["rollout"]["agent"].pop("default_agent_loop")
        tree["actor_rollout_ref"]["rollout"].pop("custom", None)
        tree.pop("treetune", None)
    assert da == db


def test_stock_arm_refuses_the_probe(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "E2E_PRINT_ARGS": "1", "E2E_BLOCK": "0", "E2E_PROBE": "1"}
    env |= {"MODEL_PATH": str(tmp_path), "E2E_WORKDIR": str(tmp_path)}
    result = subprocess.run(["bash", str(E2E_SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "E2E_PROBE=1 needs the override block" in result.stderr
