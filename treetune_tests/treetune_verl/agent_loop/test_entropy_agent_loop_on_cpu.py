# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The entropy agent loops and worker on verl 0.7.1's real classes, with a stand-in only for the inference server.

Real: Hydra-composed ``ppo_trainer`` (with the README override block), ``AgentLoopWorker.generate_sequences``
(registry -> ``hydra.utils.instantiate`` -> loop ``run`` -> ``_agent_loop_postprocess`` -> ``_postprocess``), verl's
single-turn and tool loops (tool parser, tool registry, interaction registry), ``DataProto``. Stand-in:
``FakeEntropyServer`` in place of ``AsyncLLMServerManager`` + sglang, serving known, strictly positive entropies.
"""

from __future__ import annotations

import pytest
import torch
from verl.protocol import DataProto

from treetune_tests.treetune_verl.agent_loop.fakes import (
    FakeEntropyServer,
    assert_served_entropy,
    compose_config,
    make_batch,
    unpadded,
)
from treetune_verl.agent_loop import (
    ROLLOUT_ENTROPY_KEY,
    EntropyAgentLoopManager,
    EntropyAgentLoopWorker,
    EntropyRecorder,
    check_rollout_config,
    pad_response_entropy,
    rollout_entropy_metrics,
)

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 128


@pytest.fixture(scope="module")
def config(tiny_model_dir, tmp_path_factory):
    return compose_config(tiny_model_dir, tmp_path_factory.mktemp("cfg"), PROMPT_LENGTH, RESPONSE_LENGTH)


@pytest.fixture(scope="module")
def worker(config, tiny_model_dir):
    worker = EntropyAgentLoopWorker(config, servers=[], load_balancer_handle=None)
    worker.server_manager = FakeEntropyServer(str(tiny_model_dir), PROMPT_LENGTH, RESPONSE_LENGTH)
    return worker


async def _generate(worker, plans: list[str], agent_names: list[str]) -> DataProto:
    out = await worker.generate_sequences(make_batch(plans, agent_names))
    assert out.batch[ROLLOUT_ENTROPY_KEY].shape == (len(plans), RESPONSE_LENGTH)
    assert out.batch[ROLLOUT_ENTROPY_KEY].dtype == torch.float32
    assert not any("entropy" in key for key in out.non_tensor_batch), sorted(out.non_tensor_batch)
    return out


async def test_single_turn(worker):
    plans = ["text", "long", "overlong"]
    out = await _generate(worker, plans, ["entropy_single_turn_agent"] * 3)
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
    out = await _generate(worker, plans, ["entropy_tool_agent"] * 4)
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
    out = await _generate(worker, plans, names)
    for i, name in enumerate(names):
        assert_served_entropy(out, i, carries_entropy=name.startswith("entropy_"))
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
    out = await _generate(yaml_worker, ["text", "tool text text"], ["single_turn_agent", "tool_agent"])
    assert_served_entropy(out, 0)
    assert_served_entropy(out, 1)


async def test_dataproto_ops_keep_rollout_entropy(worker):
    out = await _generate(worker, ["text", "tool text text", "long", "bigtool"], ["entropy_tool_agent"] * 4)
    entropy = out.batch[ROLLOUT_ENTROPY_KEY].clone()
    # the trainer's order: repeat the prompts batch, union the rollout, reorder to balance, chunk, select
    prompts = DataProto.from_dict(tensors={"uid_order": torch.arange(4)})
    batch = prompts.union(out)
    batch.reorder(torch.tensor([2, 0, 3, 1]))
    assert torch.equal(batch.batch[ROLLOUT_ENTROPY_KEY], entropy[[2, 0, 3, 1]])
    chunks = batch.chunk(2)
    assert torch.equal(torch.cat([c.batch[ROLLOUT_ENTROPY_KEY] for c in chunks]), entropy[[2, 0, 3, 1]])
    merged = DataProto.concat(chunks)
    picked = merged.select(batch_keys=[ROLLOUT_ENTROPY_KEY, "response_mask"])
    assert torch.equal(picked.batch[ROLLOUT_ENTROPY_KEY], entropy[[2, 0, 3, 1]])


def test_metrics_over_response_mask():
    entropy = torch.tensor([[1.0, 2.0, 9.0, 0.0], [3.0, 4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]])
    metrics = rollout_entropy_metrics(entropy, mask)
    assert metrics == {
        "agent_loop/rollout_entropy/mean": 2.5,
        "agent_loop/rollout_entropy/p50": 2.5,
        "agent_loop/rollout_entropy/p90": pytest.approx(3.7),
        "agent_loop/rollout_entropy/max": 4.0,
    }
    assert rollout_entropy_metrics(entropy, torch.zeros_like(mask)) == {}


async def test_manager_reports_metrics_through_verl_timing(worker):
    """verl's ``AgentLoopManager._performance_metrics`` output is what ``ray_trainer.fit`` logs as ``timing_s/*``."""
    out = await _generate(worker, ["text", "tool text text"], ["entropy_single_turn_agent", "entropy_tool_agent"])
    worker_metrics = [out.meta_info["metrics"]]
    manager = object.__new__(EntropyAgentLoopManager)  # only the metrics method, no servers
    timing = manager._performance_metrics(worker_metrics, out)
    assert "agent_loop/generate_sequences/mean" in timing  # verl's own statistics still there
    mask = out.batch["response_mask"].bool()
    values = out.batch[ROLLOUT_ENTROPY_KEY][mask].double()
    assert timing["agent_loop/rollout_entropy/mean"] == pytest.approx(values.mean().item())
    assert timing["agent_loop/rollout_entropy/max"] == pytest.approx(values.max().item())
    assert timing["agent_loop/rollout_entropy/p50"] <= timing["agent_loop/rollout_entropy/p90"]


def test_pad_response_entropy():
    row = pad_response_entropy([0.5, 1.5], num_tokens=2, response_length=4)
    assert row.dtype == torch.float32 and torch.equal(row, torch.tensor([[0.5, 1.5, 0.0, 0.0]]))
    assert torch.equal(pad_response_entropy(None, 3, 4), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="response tokens"):
        pad_response_entropy([0.5], num_tokens=2, response_length=4)


async def test_recorder_refuses_missing_entropy(worker, tiny_model_dir):
    server = FakeEntropyServer(str(tiny_model_dir), PROMPT_LENGTH, RESPONSE_LENGTH)
    recorder = EntropyRecorder(server)
    assert recorder.prompt_length == PROMPT_LENGTH  # forwarded
    with pytest.raises(RuntimeError, match="no generate"):
        recorder.take()
    with pytest.raises(RuntimeError, match="calculate_log_probs=True"):
        await recorder.generate("r", prompt_ids=[1, 2], sampling_params={"logprobs": False})


def test_config_refusals(config):
    from omegaconf import OmegaConf

    from treetune_verl.sglang.patching import UnsupportedSGLangError

    rollout = OmegaConf.to_container(config.actor_rollout_ref.rollout, resolve=True)
    assert check_rollout_config(rollout).top_k is None
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        check_rollout_config({**rollout, "calculate_log_probs": False})
    with pytest.raises(ValueError, match="custom.entropy"):
        check_rollout_config({**rollout, "custom": {"entropy": {"top_k": 0, "mode": "hot"}}})
    with pytest.raises(UnsupportedSGLangError, match="dp_size"):
        check_rollout_config({**rollout, "data_parallel_size": 2})
    mtp = {**rollout["mtp"], "enable": True, "enable_rollout": True, "speculative_algorithm": "EAGLE"}
    with pytest.raises(UnsupportedSGLangError, match="speculative"):
        check_rollout_config({**rollout, "mtp": mtp})
    with pytest.raises(UnsupportedSGLangError, match="speculative"):
        check_rollout_config({**rollout, "engine_kwargs": {"sglang": {"speculative_algorithm": "NGRAM"}}})
    wrong_name = OmegaConf.merge(config, {"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    with pytest.raises(ValueError, match="name must be sglang"):
        EntropyAgentLoopManager(wrong_name)
