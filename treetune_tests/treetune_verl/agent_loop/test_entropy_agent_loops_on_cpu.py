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
from treetune_tests.treetune_verl.agent_loop.fakes import (
    TOOL_CALL,
    assert_served_entropy,
    compose_config,
    make_batch,
    unpadded,
)
from treetune_verl.agent_loop import HAS_ROLLOUT_ENTROPY_KEY
from treetune_verl.verl.v0_7_1.worker import EntropyAgentLoopWorker


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


async def test_aborted_turns_end_the_loop_and_empty_responses_are_well_formed(worker):
    """A turn aborted in sglang (stop reason ``"abort"``) ends the tool loop even when its partial text is a tool
    call (verl's loop would run the tool and go on), and a row without any response token is an empty, well-formed
    row (verl's postprocessing cannot pad it; its tool loop would return the prompt as the response)."""
    names = ["entropy_tool_agent", "entropy_tool_agent", "entropy_single_turn_agent", "entropy_tool_agent"]
    plans = ["abortedtool text", "empty", "empty", "text abortedtool text"]
    out = await generate(worker, plans, names)
    prompt_length = out.batch["prompts"].shape[1]
    # row 0: one model turn (the partial tool call, kept, masked 1), no tool response, no further turn
    prompt, response, mask, _ = unpadded(out, 0)
    assert worker.server_manager.tokenizer.decode(response) == TOOL_CALL and bool(mask[: len(response)].all())
    assert out.non_tensor_batch["__num_turns__"][0] == 2  # user + the aborted assistant turn
    assert_served_entropy(out, 0)
    # rows 1 and 2: no token -> empty response: no attention, no mask, no log-prob, no entropy, padding ids
    for i in (1, 2):
        assert not out.batch["attention_mask"][i, prompt_length:].any(), f"row {i}"
        assert not out.batch["response_mask"][i].any() and not out.batch["rollout_log_probs"][i].any()
        assert not out.batch["rollout_entropy"][i].any()
        assert (out.batch["responses"][i] == worker.tokenizer.pad_token_id).all()
        assert out.batch["attention_mask"][i, :prompt_length].sum() == len(unpadded(out, i)[0]) > 0
    # position ids continue the prompt's, exactly as for verl's padding after a response
    assert torch.equal(out.batch["position_ids"][1], out.batch["position_ids"][2])
    # row 3: model turn, user turn, then the aborted turn ends the loop before its tool call runs
    assert out.non_tensor_batch["__num_turns__"][3] == 4
    assert_served_entropy(out, 3)
    # none of these was aborted by over-sampling: kept rows, as the batch key says
    assert out.batch["rollout_aborted"].tolist() == [False] * 4
