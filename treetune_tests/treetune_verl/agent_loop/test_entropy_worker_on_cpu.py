# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``EntropyAgentLoopWorker``: ``rollout_entropy`` padded like ``responses`` and kept through verl's ``DataProto`` ops."""

from __future__ import annotations

import torch
from verl.protocol import DataProto

from treetune_tests.treetune_verl.agent_loop.conftest import generate
from treetune_verl.agent_loop import ROLLOUT_ENTROPY_KEY


async def test_dataproto_ops_keep_rollout_entropy(worker):
    out = await generate(worker, ["text", "tool text text", "long", "bigtool"], ["entropy_tool_agent"] * 4)
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
