# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The README override block and the e2e script's command, composed by Hydra with verl 0.7.1's ``ppo_trainer``.

The block (``treetune_verl/config/grpo_entropy_overrides.txt``) must resolve to the keys that turn rollout entropy
on, survive verl's own dataclass conversion and class loading, and be passed verbatim by
``treetune_tests/e2e/test_entropy_e2e.sh``, with nothing after it that would change which classes run. (The runs
themselves: ``treetune_tests/e2e/test_e2e_variants_on_cpu.py``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from treetune_verl.config import AGENT_LOOPS_YAML, read_overrides

REPO_ROOT = Path(__file__).resolve().parents[3]
E2E_SCRIPT = REPO_ROOT / "treetune_tests" / "e2e" / "test_entropy_e2e.sh"
MANAGER = "treetune_verl.verl.EntropyAgentLoopManager"


def _compose(overrides: list[str]):
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def _script(env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(E2E_SCRIPT)], env=env, capture_output=True, text=True, timeout=300)


def test_block_composes_with_ppo_trainer():
    from verl.utils.import_utils import load_class_from_fqn
    from verl.workers.config import RolloutConfig

    from treetune_verl.rollout.rollout_config import check_rollout_config, entropy_config
    from treetune_verl.verl import EntropyAgentLoopManager

    block = read_overrides()
    assert block == ["hydra.searchpath=[pkg://treetune_verl.config]", "+treetune=rollout_entropy"]
    rollout = _compose(block).actor_rollout_ref.rollout
    assert rollout.name == "sglang" and rollout.mode == "async"
    assert rollout.calculate_log_probs is True
    assert OmegaConf.to_container(rollout.custom.entropy) == {
        "top_k": 0,
        "mode": "raw",
        "pg_token_quantile": None,  # steering off by default
        "advantage_shaping": {"alpha": None, "kappa": 2.0},
    }
    assert rollout.agent.agent_loop_manager_class == MANAGER
    assert rollout.agent.default_agent_loop == "entropy_single_turn_agent"
    # what verl does with it: the dataclass conversion (servers, workers) and the trainer's class loading
    from verl.utils.config import omega_conf_to_dataclass

    dataclass_config = omega_conf_to_dataclass(rollout)
    assert isinstance(dataclass_config, RolloutConfig) and dataclass_config.custom["entropy"]["top_k"] == 0
    assert check_rollout_config(dataclass_config) == entropy_config(rollout)
    assert load_class_from_fqn(rollout.agent.agent_loop_manager_class, "AgentLoopManager") is EntropyAgentLoopManager

    later = _compose(block + ["actor_rollout_ref.rollout.custom.entropy.top_k=20", "actor_rollout_ref.rollout.n=4"])
    assert later.actor_rollout_ref.rollout.custom.entropy.top_k == 20  # later overrides win
    assert entropy_config(later.actor_rollout_ref.rollout).top_k == 20


def test_agent_loops_yaml_targets_our_loops():
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from treetune_verl.agent_loop import EntropySingleTurnAgentLoop
    from treetune_verl.verl import EntropyToolAgentLoop

    entries = {entry.name: get_class(entry._target_) for entry in OmegaConf.load(AGENT_LOOPS_YAML)}
    assert entries == {
        "entropy_single_turn_agent": EntropySingleTurnAgentLoop,
        "entropy_tool_agent": EntropyToolAgentLoop,
        "single_turn_agent": EntropySingleTurnAgentLoop,
        "tool_agent": EntropyToolAgentLoop,
    }


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_e2e_script_passes_the_block_verbatim_and_composes(tiny_model_dir, tmp_path, device):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": device, "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    result = _script(env)
    assert result.returncode == 0, result.stderr
    args = result.stdout.splitlines()
    block = read_overrides()
    start = args.index(block[0])
    assert args[start:] == block  # exactly the README block, in order, and nothing after it by default
    config = _compose(args)
    rollout = config.actor_rollout_ref.rollout
    assert config.algorithm.adv_estimator == "grpo" and config.trainer.total_training_steps == 2
    assert rollout.calculate_log_probs is True and rollout.name == "sglang" and rollout.n == 2
    assert rollout.response_length == 64 and config.data.train_batch_size == 4
    assert rollout.agent.agent_loop_manager_class == MANAGER
    assert config.trainer.logger == ["console", "file"]
    assert (config.trainer.device == "cpu") == (device == "cpu")


def test_e2e_probe_mode_swaps_in_a_subclass_of_our_manager(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_PROBE": "1", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    result = _script(env)
    assert result.returncode == 0, result.stderr
    args = result.stdout.splitlines()
    block = read_overrides()
    start = args.index(block[0])
    assert args[start + len(block) :] == [
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class="
        "treetune_tests.e2e.e2e_probe.ProbedEntropyAgentLoopManager"
    ]
    from treetune_tests.e2e.e2e_probe import ProbedEntropyAgentLoopManager
    from treetune_verl.verl import EntropyAgentLoopManager

    assert issubclass(ProbedEntropyAgentLoopManager, EntropyAgentLoopManager)


def test_readme_shows_exactly_the_override_block():
    readme = (REPO_ROOT / "README.md").read_text().splitlines()
    block = read_overrides()
    starts = [i for i in range(len(readme)) if readme[i : i + len(block)] == block]
    assert starts, "README.md must show treetune_verl/config/grpo_entropy_overrides.txt verbatim"
    fence = starts[0]
    assert readme[fence - 1].startswith("```") and readme[fence + len(block)] == "```"
