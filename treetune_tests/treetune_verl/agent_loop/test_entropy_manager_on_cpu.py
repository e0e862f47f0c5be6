# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``EntropyAgentLoopManager``: its metrics reach verl's timing dict; it refuses a rollout that is not sglang."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from treetune_tests.treetune_verl.agent_loop.conftest import generate
from treetune_verl.agent_loop import ROLLOUT_ENTROPY_KEY
from treetune_verl.verl import EntropyAgentLoopManager


async def test_manager_reports_metrics_through_verl_timing(worker):
    """verl's ``AgentLoopManager._performance_metrics`` output is what ``ray_trainer.fit`` logs as ``timing_s/*``."""
    out = await generate(worker, ["text", "tool text text"], ["entropy_single_turn_agent", "entropy_tool_agent"])
    worker_metrics = [out.meta_info["metrics"]]
    manager = object.__new__(EntropyAgentLoopManager)  # only the metrics method, no servers
    timing = manager._performance_metrics(worker_metrics, out)
    assert "agent_loop/generate_sequences/mean" in timing  # verl's own statistics still there
    mask = out.batch["response_mask"].bool()
    values = out.batch[ROLLOUT_ENTROPY_KEY][mask].double()
    assert timing["agent_loop/rollout_entropy/mean"] == pytest.approx(values.mean().item())
    assert timing["agent_loop/rollout_entropy/max"] == pytest.approx(values.max().item())
    assert timing["agent_loop/rollout_entropy/p50"] <= timing["agent_loop/rollout_entropy/p90"]


def test_refuses_a_rollout_other_than_sglang(config):
    wrong_name = OmegaConf.merge(config, {"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    with pytest.raises(ValueError, match="name must be sglang"):
        EntropyAgentLoopManager(wrong_name)


async def test_stock_loop_rows_are_left_out_of_the_metrics(worker, caplog):
    """Rows from a stock verl loop (zeros, not entropies) are marked and excluded, with a warning naming the fix."""
    names = ["entropy_single_turn_agent", "single_turn_agent"]
    out = await generate(worker, ["text", "text"], names)
    manager = object.__new__(EntropyAgentLoopManager)
    with caplog.at_level("WARNING"):
        timing = manager._performance_metrics([out.meta_info["metrics"]], out)
    ours = out.batch["response_mask"][0].bool()
    expected = out.batch[ROLLOUT_ENTROPY_KEY][0][ours].double().mean().item()
    assert timing["agent_loop/rollout_entropy/mean"] == pytest.approx(expected)
    assert timing["agent_loop/rollout_entropy/rows_without_entropy"] == 1.0
    assert "carry no entropy" in caplog.text
