# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every pair of treetune features starts together in verl 0.7.1's ``main_ppo``, or is refused naming both keys.

Each command line is the e2e script's own (``test_entropy_e2e.sh`` with ``E2E_PRINT_ARGS=1``: the README block and
each feature's switches or overrides, in the order the script writes them), composed by Hydra from verl's real
``ppo_trainer`` config, then put through what a run does at start-up before any process starts: verl's
``migrate_legacy_reward_impl`` and ``validate_config`` (as ``main_ppo`` / ``TaskRunner.run``), verl's rollout dataclass
(what every worker builds), our manager's refusals (``check_rollout_config``) and the trainer-side entry point's
(``features.check_features``). Starting Ray, the engine and the FSDP workers for each of the 15 combinations would
take half an hour of CI; the run with every feature at once is the e2e variants' full / resume pair (``test_e2e_variants_on_cpu.py``), and the
actor entry point's import in a worker process is ``ppo/test_loss_aggregation_on_cpu.py``'s subprocess test.
"""

from __future__ import annotations

import itertools
import os

import pytest
import verl
from omegaconf import OmegaConf

from treetune_tests.e2e.script import run_script
from treetune_verl.config import AGENT_LOOPS_YAML
from treetune_verl.rollout.rollout_config import check_rollout_config
from treetune_verl.trainer.features import PROCESS_SETUP_MODULE, RunFeatures, check_features

CONFIG_DIR = os.path.dirname(AGENT_LOOPS_YAML)
# feature -> (the e2e script's switches, extra Hydra overrides)
FEATURES: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "over_sampling": ({"E2E_OVER_SAMPLE": "0.25"}, ()),
    "forking_tokens": ({"E2E_PG_TOKEN_QUANTILE": "0.2"}, ()),
    "advantage_shaping": ({}, ("actor_rollout_ref.rollout.custom.entropy.advantage_shaping.alpha=0.4",)),
    "forecast": ({"E2E_FORECAST": "1"}, ()),
    "managed_agent": (
        {},
        (
            "actor_rollout_ref.rollout.agent.default_agent_loop=entropy_managed_agent",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={CONFIG_DIR}/managed_agent_loops.yaml",
            "+actor_rollout_ref.rollout.custom.managed.agent_fn=treetune_tests.treetune_verl.managed.agents:two_turn_agent",
        ),
    ),
}
# What RunFeatures.enabled reports for each (managed sessions are a loop of the rollout-entropy manager).
ENABLED = {
    "over_sampling": "over_sampling",
    "forking_tokens": "steering",
    "advantage_shaping": "steering",
    "forecast": "forecast",
    "managed_agent": None,
}
COMBINATIONS = [(name,) for name in FEATURES] + list(itertools.combinations(FEATURES, 2))


def _command_line(names: tuple[str, ...], tiny_model_dir, tmp_path) -> list[str]:
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    extra: list[str] = []
    for name in names:
        switches, overrides = FEATURES[name]
        env |= switches
        extra += overrides
    result = run_script(env, *extra, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def start_up(config) -> RunFeatures:
    """What a ``main_ppo`` run checks before its first process starts, verl's and ours; the features on."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import RolloutConfig

    config = migrate_legacy_reward_impl(config)
    OmegaConf.resolve(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout, RolloutConfig)
    check_rollout_config(config.actor_rollout_ref.rollout)
    return check_features(config)


@pytest.mark.parametrize("names", COMBINATIONS, ids=["+".join(c) for c in COMBINATIONS])
def test_every_pair_of_features_starts(names, tiny_model_dir, tmp_path):
    config = _compose(_command_line(names, tiny_model_dir, tmp_path))
    features = start_up(config)
    assert features.rollout_entropy  # every combination runs on the README block
    expected = {"rollout_entropy"} | {ENABLED[name] for name in names if ENABLED[name]}
    assert set(features.enabled) == expected
    if {"over_sampling", "forecast"} & set(names):  # both blocks name the one actor entry point
        assert config.actor_rollout_ref.model.external_lib == PROCESS_SETUP_MODULE


def test_the_forecast_block_starts_without_the_rollout_entropy_block(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    args = run_script({**env, "E2E_FORECAST": "1", "E2E_BLOCK": "0"}, timeout=300).stdout.splitlines()
    features = check_features(_compose(args))
    assert features.enabled == ["forecast"]


def _config(**sections):
    base = {
        "algorithm": {"adv_estimator": "grpo_valid"},
        "trainer": {"use_legacy_worker_impl": "auto"},
        "actor_rollout_ref": {
            "model": {"external_lib": PROCESS_SETUP_MODULE},
            "rollout": {"agent": {"agent_loop_manager_class": "treetune_verl.verl.EntropyAgentLoopManager"}},
        },
    }
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(sections))


@pytest.mark.parametrize(
    ("sections", "first_key", "second_key"),
    [
        (  # over-sampling without the rollout-entropy manager: nothing would read the rate
            {"actor_rollout_ref": {"rollout": {"over_sample_rate": 0.25, "agent": {"agent_loop_manager_class": None}}}},
            "over_sample_rate",
            "agent_loop_manager_class",
        ),
        (  # steering without it: no rollout entropy to steer with
            {
                "actor_rollout_ref": {
                    "rollout": {
                        "custom": {"entropy": {"pg_token_quantile": 0.2}},
                        "agent": {"agent_loop_manager_class": None},
                    }
                }
            },
            "pg_token_quantile",
            "agent_loop_manager_class",
        ),
        (  # the forecast without the actor entry point
            {"actor_rollout_ref": {"model": {"external_lib": None}, "rollout": {"custom": {"entropy_forecast": {}}}}},
            "entropy_forecast",
            "external_lib",
        ),
        (  # the forecast on verl's new worker implementation, which the actor seams do not reach
            {
                "trainer": {"use_legacy_worker_impl": "disable"},
                "actor_rollout_ref": {"rollout": {"custom": {"entropy_forecast": {}}}},
            },
            "entropy_forecast",
            "use_legacy_worker_impl",
        ),
        (  # managed sessions of two rows with over-sampling, which counts one trajectory per row
            {
                "actor_rollout_ref": {
                    "rollout": {"n": 4, "over_sample_rate": 0.25, "custom": {"managed": {"rows_per_session": 2}}}
                }
            },
            "rows_per_session",
            "over_sample_rate",
        ),
        (  # a prompt's rollout.n rows cannot be split into sessions of rows_per_session rows
            {"actor_rollout_ref": {"rollout": {"n": 3, "custom": {"managed": {"rows_per_session": 2}}}}},
            "rows_per_session",
            "rollout.n",
        ),
        (  # over-sampling with verl's gpg, whose batch-wide scale counts aborted rows
            {"algorithm": {"adv_estimator": "gpg"}, "actor_rollout_ref": {"rollout": {"over_sample_rate": 0.25}}},
            "over_sample_rate",
            "adv_estimator",
        ),
    ],
)
def test_what_cannot_run_is_refused_naming_both_keys(sections, first_key, second_key):
    with pytest.raises(ValueError) as refused:
        check_features(_config(**sections))
    assert first_key in str(refused.value) and second_key in str(refused.value), str(refused.value)


def test_features_are_off_by_default():
    assert check_features(_config()).enabled == ["rollout_entropy"]
    assert RunFeatures().enabled == []
