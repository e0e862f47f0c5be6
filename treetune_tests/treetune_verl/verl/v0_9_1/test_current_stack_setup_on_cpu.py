# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: what the block selects before verl starts the servers, and what it refuses at start-up.

Each command line is the e2e script's own (``E2E_PRINT_ARGS=1``) on the current stack, composed by Hydra from verl
0.9.1's real ``ppo_trainer`` config. The server selection runs in verl's real ``LLMServerManager.__init__`` (wrapped
by the actor entry point, as ``external_lib`` imports it in the trainer's process); ``__init__`` starts nothing (the
servers start in ``create``), so no Ray is needed. The runs that train with it:
``treetune_tests/e2e/test_e2e_variants_on_cpu.py``.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from treetune_tests.e2e.script import run_script
from treetune_tests.treetune_verl.trainer.test_features_on_cpu import _command_line, _compose
from treetune_verl.trainer.features import check_current_stack

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")


@pytest.fixture(scope="module")
def process_setup():
    import treetune_verl.verl.process_setup  # noqa: F401  (what external_lib does in each verl process)
    from treetune_verl.verl.v0_9_1 import process_setup

    return process_setup


def _manager(config):
    from verl.workers.rollout.llm_server import LLMServerManager

    return LLMServerManager(config, worker_group=object())


def test_the_block_selects_the_entropy_server_for_the_policy_only(process_setup, tiny_model_dir, tmp_path):
    from verl.workers.rollout.replica import get_rollout_replica_class

    from treetune_verl.rollout.replica import EntropySGLangReplica

    config = _compose(_command_line((), tiny_model_dir, tmp_path))
    assert check_current_stack(config, "0.9.1").enabled == ["rollout_entropy"]
    assert _manager(config).rollout_replica_class is EntropySGLangReplica
    assert process_setup.server_selected()
    # the reward model's and the teacher's replicas come from verl's registry, untouched
    assert get_rollout_replica_class("sglang") is not EntropySGLangReplica
    assert issubclass(EntropySGLangReplica, get_rollout_replica_class("sglang"))


def test_a_run_without_the_block_keeps_verls_server(process_setup, tiny_model_dir, tmp_path):
    from verl.workers.rollout.replica import get_rollout_replica_class

    env = {"E2E_PRINT_ARGS": "1", "E2E_BLOCK": "0", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    config = _compose(run_script(env, timeout=300).stdout.splitlines())  # the e2e script's stock arm
    assert _manager(config).rollout_replica_class is get_rollout_replica_class("sglang")


def test_the_forecast_starts_with_the_block_and_is_refused_without(process_setup, tiny_model_dir, tmp_path):
    """The e2e script's forecast command line starts (the engine worker's seam, ``actor_seams.py``); without the
    block's manager, whose trainer seams report the forecast's metrics, it is refused before any server."""
    from treetune_verl.trainer.features import MANAGER_KEY

    overrides = _command_line(("forecast",), tiny_model_dir, tmp_path)
    assert "forecast" in check_current_stack(_compose(overrides), "0.9.1").enabled
    _manager(_compose(overrides))  # not refused
    without_block = _compose([*overrides, f"{MANAGER_KEY}=null"])
    with pytest.raises(ValueError, match="entropy_forecast on verl 0.9.1 runs with rollout entropy"):
        _manager(without_block)


def test_failed_rows_aborted_start_with_the_replay_buffer_and_are_refused_without(
    process_setup, tiny_model_dir, tmp_path
):
    """``abort_failed_rows=true`` without over-sampling runs in the same replay buffer (rate 0: every whole group)."""
    overrides = [
        *_command_line(("over_sampling",), tiny_model_dir, tmp_path),
        "actor_rollout_ref.rollout.over_sample_rate=0",
        "+actor_rollout_ref.rollout.custom.over_sample.abort_failed_rows=true",
    ]
    features = check_current_stack(_compose(overrides), "0.9.1")
    assert features.abort_failed_rows and features.over_sample_rate == 0
    _manager(_compose(overrides))  # not refused
    without_buffer = [*overrides, "trainer.v1.sampler.custom_sampler.name=null"]
    with pytest.raises(ValueError, match="over-sampling .*abort_failed_rows=true.* on verl 0.9.1 runs in its replay"):
        _manager(_compose(without_buffer))


def test_over_sampling_starts_on_verl_0_9_1_with_its_replay_buffer(process_setup, tiny_model_dir, tmp_path):
    """The e2e script's over-sampling command line (grpo_valid, token-mean, the replay buffer's keys) starts."""
    config = _compose(_command_line(("over_sampling",), tiny_model_dir, tmp_path))
    assert check_current_stack(config, "0.9.1").enabled == ["rollout_entropy", "over_sampling"]
    _manager(config)  # not refused


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("trainer.v1.sampler.custom_sampler.name=null", "runs in its replay buffer: set trainer.v1.sampler"),
        ("trainer.v1.trainer_mode=colocate_async", "needs trainer.v1.trainer_mode=sync"),
        ("+trainer.v1.sync.parameter_sync_step=2", "samples each step in one part: not trainer.v1.sync.param"),
        ("algorithm.filter_groups.enable=true", "does not run algorithm.filter_groups.enable=true: verl does not"),
        ("trainer.v1.sampler.sync_refill_failed_groups=true", "does not run trainer.v1.sampler.sync_refill_failed"),
        ("algorithm.adv_estimator=gpg", "adv_estimator=gpg: its batch-wide scale .* Use one of: .*grpo,"),
        ("algorithm.adv_estimator=opo", "adv_estimator=opo: the padding group's length-weighted baseline"),
        ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", "loss_agg_mode=seq-mean-token-mean: divides"),
    ],
)
def test_over_sampling_on_verl_0_9_1_refuses_what_verls_padding_makes_wrong(
    override, words, process_setup, tiny_model_dir, tmp_path
):
    config = _compose([*_command_line(("over_sampling",), tiny_model_dir, tmp_path), override])
    with pytest.raises(ValueError, match=f"over-sampling .* on verl 0.9.1 .*{words}"):
        _manager(config)


def _carry_over_command_line(tiny_model_dir, tmp_path) -> list[str]:
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "MODEL_PATH": str(tiny_model_dir), "E2E_WORKDIR": str(tmp_path)}
    result = run_script({**env, "E2E_OVER_SAMPLE": "0.25", "E2E_CARRY_OVER": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_carry_over_starts_on_verl_0_9_1_and_refuses_what_it_needs_by_key(process_setup, tiny_model_dir, tmp_path):
    """The e2e script's carry-over command line (with data.gen_batch_size=1 and token-level rollout correction)
    starts; without either, the run is refused naming the key."""
    command_line = _carry_over_command_line(tiny_model_dir, tmp_path)
    assert "data.gen_batch_size=1" in command_line
    features = check_current_stack(_compose(command_line), "0.9.1")
    assert features.carry_over and features.enabled == ["rollout_entropy", "over_sampling"]
    _manager(_compose(command_line))  # not refused
    refusals = {
        "data.gen_batch_size=null": "fetches in whole data.gen_batch_size chunks: set data.gen_batch_size=1",
        "algorithm.rollout_correction.rollout_is=null": "set verl's rollout correction",
    }
    for override, words in refusals.items():
        without = [arg for arg in command_line if not arg.startswith(override.split("=")[0])] + [override]
        with pytest.raises(ValueError, match=words):
            _manager(_compose(without))


def test_managed_sessions_start_on_verl_0_9_1_and_their_rows_are_refused_with_over_sampling(
    process_setup, tiny_model_dir, tmp_path
):
    """Sessions of 2 rows start (n = 4: two sessions per prompt); with over-sampling they are refused naming both keys."""
    rows = ["actor_rollout_ref.rollout.n=4", "+actor_rollout_ref.rollout.custom.managed.rows_per_session=2"]
    config = _compose([*_command_line(("managed_agent",), tiny_model_dir, tmp_path), *rows])
    features = check_current_stack(config, "0.9.1")
    assert features.rows_per_session == 2 and features.enabled == ["rollout_entropy"]
    _manager(config)  # not refused
    with pytest.raises(ValueError, match="rows_per_session=2 with actor_rollout_ref.rollout.over_sample_rate"):
        _manager(_compose([*_command_line(("managed_agent", "over_sampling"), tiny_model_dir, tmp_path), *rows]))


@pytest.mark.parametrize("name", ["forking_tokens", "advantage_shaping"])
def test_steering_starts_on_verl_0_9_1(name, process_setup, tiny_model_dir, tmp_path):
    """Forking tokens and advantage shaping run in the trainer's process (the V1 seam after _compute_advantage)."""
    config = _compose(_command_line((name,), tiny_model_dir, tmp_path))
    assert check_current_stack(config, "0.9.1").enabled == ["rollout_entropy", "steering"]
    _manager(config)  # not refused


@pytest.mark.parametrize(
    ("override", "key"),
    [("trainer.use_v1=false", "trainer.use_v1"), ("trainer.v1.trainer_mode=separate_async", "trainer.v1.trainer_mode")],
)
def test_trainers_the_seams_do_not_reach_are_refused(override, key, process_setup, tiny_model_dir, tmp_path):
    config = _compose([*_command_line((), tiny_model_dir, tmp_path), override])
    with pytest.raises(ValueError, match=key):
        _manager(config)


def test_the_manager_refuses_a_run_whose_servers_are_not_ours(process_setup, monkeypatch):
    """Without the actor entry point verl's stock server would serve rows without entropy: refused by name."""
    from treetune_verl.verl import EntropyAgentLoopManager

    monkeypatch.setattr(process_setup, "_POLICY_SERVER_MANAGER", None)
    with pytest.raises(ValueError, match="external_lib=treetune_verl.verl.process_setup"):
        EntropyAgentLoopManager(None, None)


def test_the_loops_yaml_gives_verl_0_9_1s_tool_loop():
    """Datasets naming verl's tool_agent get our loop through the loops YAML: on verl 0.9.1 its own tool loop."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from treetune_verl.agent_loop.entropy_single_turn_agent_loop import EntropySingleTurnAgentLoop
    from treetune_verl.config import AGENT_LOOPS_YAML
    from treetune_verl.verl.v0_9_1.entropy_tool_agent_loop import EntropyToolAgentLoop

    entries = {entry.name: get_class(entry._target_) for entry in OmegaConf.load(AGENT_LOOPS_YAML)}
    assert entries["tool_agent"] is entries["entropy_tool_agent"] is EntropyToolAgentLoop
    assert entries["single_turn_agent"] is EntropySingleTurnAgentLoop
    with pytest.raises(Exception, match="supports? verl 0.7.1; found 0.9.1"):
        importlib.import_module("treetune_verl.verl.v0_7_1.entropy_tool_agent_loop")  # verl 0.7.1's, refused here


def test_our_loops_are_in_verls_registry_once_and_a_taken_name_is_refused(process_setup, monkeypatch):
    """The registry entries are ``Replace``s: each names a class Hydra resolves (as verl's worker does), set once, and
    a name another loop holds refuses the install instead of leaving ours silently out (``setdefault`` did that)."""
    from hydra.utils import get_class
    from verl.experimental.agent_loop import agent_loop

    from treetune_verl.patching import is_replaced, restore
    from treetune_verl.verl_guard import UnsupportedVerlError

    registry = agent_loop._agent_loop_registry
    for name, target in process_setup.LOOPS.items():
        assert registry[name] == {"_target_": target} and get_class(target).__name__ == target.rsplit(".", 1)[1]
    process_setup.install()  # idempotent: the entries found as ours
    assert all(is_replaced(registry, name) for name in process_setup.LOOPS)

    name = "entropy_tool_agent"
    ours = registry[name]
    monkeypatch.setitem(registry, name, {"_target_": "someone.else.Loop"})
    with pytest.raises(UnsupportedVerlError, match=r"_agent_loop_registry\['entropy_tool_agent'\]: is registered to"):
        process_setup.install()
    assert registry[name] == {"_target_": "someone.else.Loop"}  # left as the user had it
    monkeypatch.setitem(registry, name, ours)
    assert is_replaced(registry, name)

    snapshot = dict(registry)
    restore(registry, name)
    assert name not in registry  # upstream had no such entry
    process_setup.install()
    assert registry == snapshot
