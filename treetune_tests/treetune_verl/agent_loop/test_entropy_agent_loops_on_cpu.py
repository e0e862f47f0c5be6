# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The entropy agent loops on verl 0.7.1's real classes, with a stand-in only for the inference server.

Real: Hydra-composed ``ppo_trainer`` (with the README override block), ``AgentLoopWorker.generate_sequences``
(registry -> ``hydra.utils.instantiate`` -> loop ``run`` -> ``_agent_loop_postprocess`` -> ``_postprocess``), verl's
single-turn and tool loops (tool parser, tool registry, interaction registry), ``DataProto``. Stand-in:
``FakeEntropyServer`` in place of ``AsyncLLMServerManager`` + sglang, serving known, strictly positive entropies, so
every model-token position's expected value is recomputed from the batch alone (``assert_served_entropy``).
"""

from __future__ import annotations

import torch

from treetune_tests.treetune_verl.agent_loop.conftest import PROMPT_LENGTH, RESPONSE_LENGTH, generate
from treetune_tests.treetune_verl.agent_loop.fakes import assert_served_entropy, compose_config, make_batch, unpadded
from treetune_verl.agent_loop import HAS_ROLLOUT_ENTROPY_KEY, EntropyAgentLoopWorker


async def test_single_turn(worker):
    plans = ["text", "long", "overlong"]
    out = await generate(worker, plans, ["entropy_single_turn_agent"] * 3)
    for i in range(3):
        assert_served_entropy(out, i)
    lengths = [len(unpadded(out, i)[1]) for i in range(3)]
    assert lengths[0] == 7 and lengths[2] == RESPONSE_LENGTH, lengths  # overlong: truncated like response_ids
    # verl's own outputs are untouched: logprobs still line up with the same mask
    assert torch.equal(out.batch["rollout_log_probs"] != 0, out.batch["response_mask"].bool())
    assert list(out.non_tensor_batch["max_global_steps"]) == [None] * 3  # schema kept
    assert (out.non_tensor_batch["global_steps"] == 3).all()  # copied from the server's extra_fields


async def test_tool_loop_tools_interaction_truncation_overflow(worker):
    plans = ["tool text text", "tool long", "bigtool", "text text"]
    out = await generate(worker, plans, ["entropy_tool_agent"] * 4)
    for i in range(4):
        assert_served_entropy(out, i)
    masks = [unpadded(out, i)[2] for i in range(4)]
    responses = [unpadded(out, i)[1] for i in range(4)]
    # row 0: model, tool, model, user, model, user -> five runs of alternating mask
    changes = (masks[0][1 : len(responses[0])] != masks[0][: len(responses[0]) - 1]).sum().item()
    assert changes == 5 and masks[0][len(responses[0]) - 1] == 0, masks[0]
    assert len(responses[1]) == RESPONSE_LENGTH and masks[1][-1] == 1  # truncated inside a model turn
    assert bool(masks[2][: len(responses[2])].all())  # the overflowing tool response was dropped
    assert (out.non_tensor_batch["global_steps"] == 3).all()  # not blocked by the entropy bookkeeping
    assert list(out.non_tensor_batch["__num_turns__"]) == [7, 4, 2, 5]


async def test_mixed_with_stock_loops(worker):
    names = ["entropy_single_turn_agent", "single_turn_agent", "entropy_tool_agent", "tool_agent"]
    plans = ["text", "text", "tool text text", "tool text text"]
    out = await generate(worker, plans, names)
    for i, name in enumerate(names):
        assert_served_entropy(out, i, carries_entropy=name.startswith("entropy_"))
    assert out.batch[HAS_ROLLOUT_ENTROPY_KEY].tolist() == [name.startswith("entropy_") for name in names]
    # the stock rows are otherwise identical to ours
    assert torch.equal(out.batch["responses"][0], out.batch["responses"][1])
    assert torch.equal(out.batch["response_mask"][2], out.batch["response_mask"][3])


async def test_default_loop_and_packaged_agent_loops_yaml(worker, tiny_model_dir, tmp_path, monkeypatch):
    from verl.experimental.agent_loop import agent_loop as agent_loop_module

    from treetune_verl.config import AGENT_LOOPS_YAML

    # no agent_name column: the block's default_agent_loop (entropy_single_turn_agent) runs
    out = await worker.generate_sequences(make_batch(["text", "long"], None))
    assert_served_entropy(out, 0)
    assert_served_entropy(out, 1)
    # the packaged agent-loop YAML maps verl's built-in names to the entropy loops (registry restored afterwards)
    monkeypatch.setattr(agent_loop_module, "_agent_loop_registry", dict(agent_loop_module._agent_loop_registry))
    config = compose_config(
        tiny_model_dir,
        tmp_path,
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        extra=[f"actor_rollout_ref.rollout.agent.agent_loop_config_path={AGENT_LOOPS_YAML}"],
    )
    yaml_worker = EntropyAgentLoopWorker(config, servers=[], load_balancer_handle=None)
    yaml_worker.server_manager = worker.server_manager
    out = await generate(yaml_worker, ["text", "tool text text"], ["single_turn_agent", "tool_agent"])
    assert_served_entropy(out, 0)
    assert_served_entropy(out, 1)
