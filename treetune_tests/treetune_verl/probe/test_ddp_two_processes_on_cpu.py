# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Two DDP processes on gloo: each rank holds half of E's and U's prompts; the all-reduced probe equals one process
holding them all. Also the collective device rule (NCCL takes CUDA tensors; CPU buffers are reduced there).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from treetune_tests.treetune_verl.probe.tiny import PROMPTS, sample_batch, tiny_llama, token_count_reward_batch
from treetune_verl.probe.mixed_probe import collective_device, run_mixed_probe

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")

CONFIG = {
    "generation": {"temperature": 1.0, "top_p": 1.0},
    "estimator": {"x_estimator_mode": "naive"},
    "ground_truth": {"enable": False},  # refused under multi-process DDP (it would step every rank)
}
RANK_PROMPTS = [[0, 1], [2]]  # uneven on purpose: the prompt counts are all-reduced too


def _batches():
    model = tiny_llama()
    gen = torch.Generator().manual_seed(0)
    return model, sample_batch(model, PROMPTS, 4, 3, gen), token_count_reward_batch(model, PROMPTS, 4, 3, gen)


def _rows(batch: dict, prompts: list[int]) -> dict:
    return {key: value[prompts] for key, value in batch.items()}


def _rank(rank: int, store: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model, E, U = _batches()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)  # fresh: Δθ = lr·Ȳ/(|Ȳ|+eps) of the GLOBAL Ȳ
        result = run_mixed_probe(ddp, _rows(E, RANK_PROMPTS[rank]), _rows(U, RANK_PROMPTS[rank]), CONFIG, optimizer)
        out[rank] = {"deltaH1": result["deltaH1"], "B_E": result["B_E"], "B_U": result["B_U"]}
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_give_the_single_process_probe(tmp_path):
    model, E, U = _batches()
    single = run_mixed_probe(model, E, U, CONFIG, torch.optim.Adam(model.parameters(), lr=1e-3))
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(str(tmp_path / "store"), out), nprocs=2, start_method="spawn", join=True)
        out = dict(out)
    for rank in (0, 1):
        assert out[rank]["B_E"] == out[rank]["B_U"] == len(PROMPTS)
        assert out[rank]["deltaH1"] == pytest.approx(single["deltaH1"], rel=1e-5), (out, single["deltaH1"])


def test_collective_device_follows_the_backend(tmp_path, monkeypatch):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert collective_device() == torch.device("cpu")
    finally:
        dist.destroy_process_group()
    # NCCL (no GPU here: the backend query and the current device are stubbed) takes CUDA tensors; mixed stays CPU.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(dist, "get_backend", lambda: "nccl")
    assert collective_device() == torch.device("cuda", 1)
    monkeypatch.setattr(dist, "get_backend", lambda: "cpu:gloo,cuda:nccl")
    assert collective_device() == torch.device("cpu")
