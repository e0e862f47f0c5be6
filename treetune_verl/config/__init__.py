# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Hydra configuration shipped with the package (a package so that Hydra finds it as ``pkg://treetune_verl.config``).

- ``treetune/rollout_entropy.yaml``: the deltas to verl's ``ppo_trainer`` that turn rollout entropy on, selected
  with ``+treetune=rollout_entropy`` once ``hydra.searchpath`` includes this package.
- ``grpo_entropy_overrides.txt``: the override block for a stock ``python -m verl.trainer.main_ppo`` run, one
  override per line (the README shows it verbatim; the GPU e2e test passes exactly these lines).
- ``entropy_agent_loops.yaml``: a verl ``agent_loop_config_path`` file mapping the entropy loops, and verl's
  built-in loop names, to the entropy loops (for datasets that name ``tool_agent`` / ``single_turn_agent``).
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
OVERRIDES_FILE = CONFIG_DIR / "grpo_entropy_overrides.txt"
AGENT_LOOPS_YAML = CONFIG_DIR / "entropy_agent_loops.yaml"


def read_overrides(path: Path = OVERRIDES_FILE) -> list[str]:
    """The override lines of ``path`` (blank lines and ``#`` comments skipped)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]
