# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The DDP code path on one CPU process (gloo, world size 1): ``no_sync``, wrapped forward, ``module.`` names.

Multi-process DDP (the all-reduce of buffers and prompt counts) is ``test_ddp_two_processes_on_cpu.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from treetune_tests.treetune_verl.probe.tiny import PROMPTS, sample_batch, tiny_llama, token_count_reward_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.mixed_probe import run_mixed_probe

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")


@pytest.fixture
def single_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_wrapped_model_gives_the_same_probe_as_the_bare_model(single_process_group):
    config = {"generation": {"temperature": 1.0, "top_p": 1.0}, "estimator": {"x_estimator_mode": "rb_residual"}}
    bare = tiny_llama()
    wrapped = torch.nn.parallel.DistributedDataParallel(tiny_llama())
    gen = torch.Generator().manual_seed(0)
    E = sample_batch(bare, PROMPTS, 4, 3, gen)
    U = token_count_reward_batch(bare, PROMPTS, 4, 3, gen)

    buf_bare, _ = ProbeComponents(bare, config).accumulate_sum_X(E, 1)
    buf_ddp, _ = ProbeComponents(wrapped, config).accumulate_sum_X(E, 1)
    assert set(buf_ddp) == {f"module.{name}" for name in buf_bare}
    for name, value in buf_bare.items():
        torch.testing.assert_close(buf_ddp[f"module.{name}"], value, rtol=1e-5, atol=1e-7)

    config = {**config, "ground_truth": {"enable": True}, "optimizer": {"lr": 1e-2}}
    result_bare = run_mixed_probe(bare, E, U, config)
    result_ddp = run_mixed_probe(wrapped, E, U, config)
    assert result_ddp["deltaH1"] == pytest.approx(result_bare["deltaH1"], rel=1e-5)
    assert result_ddp["deltaH_true"] == pytest.approx(result_bare["deltaH_true"], rel=1e-3)
