# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the agent-loop tests: the Hydra-composed ``ppo_trainer`` with the README block, a real worker."""

from __future__ import annotations

import pytest
import torch
from verl.protocol import DataProto

from treetune_tests.treetune_verl.agent_loop.fakes import FakeEntropyServer, compose_config, make_batch
from treetune_verl.agent_loop import ROLLOUT_ENTROPY_KEY
from treetune_verl.verl.v0_7_1.worker import EntropyAgentLoopWorker

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 128


@pytest.fixture(scope="module")
def config(tiny_model_dir, tmp_path_factory):
    return compose_config(tiny_model_dir, tmp_path_factory.mktemp("cfg"), PROMPT_LENGTH, RESPONSE_LENGTH)


@pytest.fixture(scope="module")
def worker(config, tiny_model_dir):
    """verl's real ``AgentLoopWorker`` machinery (our subclass) with the stand-in server of ``fakes.py``."""
    worker = EntropyAgentLoopWorker(config, servers=[], load_balancer_handle=None)
    worker.server_manager = FakeEntropyServer(str(tiny_model_dir), PROMPT_LENGTH, RESPONSE_LENGTH)
    return worker


async def generate(worker, plans: list[str], agent_names: list[str] | None) -> DataProto:
    """``worker.generate_sequences`` on scripted prompts; checks the shape/dtype of ``rollout_entropy``."""
    out = await worker.generate_sequences(make_batch(plans, agent_names))
    assert out.batch[ROLLOUT_ENTROPY_KEY].shape == (len(plans), RESPONSE_LENGTH)
    assert out.batch[ROLLOUT_ENTROPY_KEY].dtype == torch.float32
    assert not any("entropy" in key for key in out.non_tensor_batch), sorted(out.non_tensor_batch)
    return out
