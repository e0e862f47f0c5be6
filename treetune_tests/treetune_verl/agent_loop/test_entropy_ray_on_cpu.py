# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The Ray path: ``EntropyAgentLoopManager.create`` -> two ``EntropyAgentLoopWorker`` actors -> ``DataProto.concat``.

Real: Ray (``num_cpus=2``), verl's ``AgentLoopManager.create`` / ``generate_sequences`` (chunk, concat, metrics),
``GlobalRequestLoadBalancer``, ``AsyncLLMServerManager`` (Ray calls to the server actor), the worker actors and
loops. Stand-in: a replica whose server actor is ``FakeEntropyServer`` (sglang needs a GPU to be launched by a
replica: ``init_standalone``/``init_hybrid`` place it on GPU bundles).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray

from treetune_tests.treetune_verl.agent_loop.fakes import (
    FakeEntropyServer,
    assert_served_entropy,
    compose_config,
    make_batch,
)
from treetune_verl.agent_loop import ROLLOUT_ENTROPY_KEY
from treetune_verl.verl import EntropyAgentLoopManager

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 128
REPO_ROOT = Path(__file__).resolve().parents[3]


class FakeReplica:
    """Stands in for ``EntropySGLangReplica``: one server actor, started by ``init_standalone``."""

    def __init__(self, replica_rank, config, model_config, gpus_per_node=8, is_reward_model=False) -> None:
        self.replica_rank = replica_rank
        self.config, self.model_config = config, model_config

    async def init_standalone(self) -> None:
        server = ray.remote(FakeEntropyServer).options(num_cpus=0, name=f"sglang_server_{self.replica_rank}_0")
        self._server_handle = server.remote(self.model_config.path, PROMPT_LENGTH, RESPONSE_LENGTH)
        self._server_address = f"fake-server-{self.replica_rank}:0"


class FakeServedEntropyManager(EntropyAgentLoopManager):
    rollout_replica_class = FakeReplica  # kept by EntropyAgentLoopManager / verl (hasattr), worker class is ours


@pytest.mark.slow
def test_manager_two_workers_concat(tiny_model_dir, tmp_path, monkeypatch):
    # Ray's worker processes must import the test's fakes (the package itself is installed).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    config = compose_config(
        tiny_model_dir,
        tmp_path,
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        extra=[
            "actor_rollout_ref.rollout.agent.num_workers=2",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        ],
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        manager = FakeServedEntropyManager.create(config)
        assert len(manager.agent_loop_workers) == 2
        names = ["entropy_single_turn_agent", "single_turn_agent", "entropy_tool_agent", "entropy_tool_agent"]
        plans = ["long", "text", "tool text text", "bigtool"]
        out = manager.generate_sequences(make_batch(plans, names))
    finally:
        ray.shutdown()
    assert out.batch[ROLLOUT_ENTROPY_KEY].shape == (4, RESPONSE_LENGTH)
    for i, name in enumerate(names):
        assert_served_entropy(out, i, carries_entropy=name.startswith("entropy_"))
    assert not any("entropy" in key for key in out.non_tensor_batch)
    timing = out.meta_info["timing"]
    mask = out.batch["response_mask"].bool()
    expected_max = out.batch[ROLLOUT_ENTROPY_KEY][mask].max().item()
    assert timing["agent_loop/rollout_entropy/max"] == pytest.approx(expected_max)
    assert {f"agent_loop/rollout_entropy/{k}" for k in ("mean", "p50", "p90", "max")} <= set(timing)
