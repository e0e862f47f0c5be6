# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy_managed_agent`` in verl's real ``AgentLoopWorker`` (our ``EntropyAgentLoopWorker``), selected through
the loops YAML, with the agent function named by ``+actor_rollout_ref.rollout.custom.managed.agent_fn``.

Server: the agent-loop tests' stand-in (``fakes.FakeEntropyServer``, a known entropy per served token), as in
``agent_loop/test_entropy_agent_loops_on_cpu.py``. Checked from the batch alone: ``rollout_entropy`` is non-zero
exactly at ``response_mask`` and holds the served values; ``rollout_log_probs`` the served log-probs; the tool
call's tokens are trained on and the tool's masked.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from treetune_tests.treetune_verl.agent_loop.fakes import (
    FakeEntropyServer,
    assert_served_entropy,
    compose_config,
    make_batch,
    unpadded,
)
from treetune_verl.agent_loop import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.config import CONFIG_DIR
from treetune_verl.verl.v0_7_1.worker import EntropyAgentLoopWorker

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 128
AGENT_FN = "treetune_tests.treetune_verl.managed.agents:openai_tool_agent"


@pytest.fixture(scope="module")
def worker(tiny_model_dir, tmp_path_factory):
    config = compose_config(
        tiny_model_dir,
        tmp_path_factory.mktemp("cfg"),
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        extra=[
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={CONFIG_DIR / 'managed_agent_loops.yaml'}",
            f"+actor_rollout_ref.rollout.custom.managed.agent_fn={AGENT_FN}",
        ],
    )
    worker = EntropyAgentLoopWorker(config, servers=[], load_balancer_handle=None)
    worker.server_manager = FakeEntropyServer(str(tiny_model_dir), PROMPT_LENGTH, RESPONSE_LENGTH)
    return worker


def test_managed_loop_rows_carry_served_entropy_at_model_tokens(worker):
    plans = ["tool text", "text"]
    out = asyncio.run(worker.generate_sequences(make_batch(plans, ["entropy_managed_agent"] * len(plans))))
    assert out.batch[ROLLOUT_ENTROPY_KEY].shape == (2, RESPONSE_LENGTH)
    assert out.batch[HAS_ROLLOUT_ENTROPY_KEY].tolist() == [True, True]
    for i in range(len(plans)):
        assert_served_entropy(out, i)  # non-zero exactly at response_mask, the served values
        _, response, mask, entropy = unpadded(out, i)
        logprobs = out.batch["rollout_log_probs"][i]
        assert torch.allclose(logprobs[mask.bool()], -entropy[mask.bool()] / 2)  # the fake serves logprob = -H/2
        assert not logprobs[~mask.bool()].any()
    mask = unpadded(out, 0)[2]
    runs = int((mask[1:] != mask[:-1]).sum())
    assert runs == 3, mask  # model (tool call) / tool (masked) / model / padding
    assert unpadded(out, 1)[2].sum() > 0 and int((unpadded(out, 1)[2][1:] != unpadded(out, 1)[2][:-1]).sum()) == 1


def test_missing_agent_fn_is_refused_naming_the_key(tiny_model_dir, tmp_path):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from treetune_verl.managed.agent_loop import ManagedAgentLoop

    config = compose_config(tiny_model_dir, tmp_path, PROMPT_LENGTH, RESPONSE_LENGTH)
    worker = EntropyAgentLoopWorker(config, servers=[], load_balancer_handle=None)
    with pytest.raises(ValueError, match=r"custom\.managed\.agent_fn"):
        ManagedAgentLoop(
            trainer_config=DictConfigWrap(config),
            server_manager=None,
            tokenizer=worker.tokenizer,
            processor=None,
            dataset_cls=worker.dataset_cls,
            data_config=DictConfigWrap(config.data),
        )
