# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main job's optimizer: ``build_optimizer`` from the config, and the Adam state warm-up.

The warm-up takes real steps at the configured lr and restores the weights after each. The reference is the
procedure it replaced: the same steps with the learning rate set to 0 by hand (weights never move). The gradient of
both comes from the probe's ``real_step`` on purpose: the claim under test is about the optimizer's state (Adam's
moments and step count do not depend on lr), not about the gradient.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from treetune_tests.treetune_verl.probe.tiny import PROMPTS, flat_params, tiny_llama, token_count_reward_batch
from treetune_verl.probe.components import ProbeComponents, probe_pass_context
from treetune_verl.probe.ground_truth import real_step
from treetune_verl.probe.optimizers import build_optimizer, warm_up_optimizer_state

T = 3


def _lr_zero_warm_up(components: ProbeComponents, batches: list[dict], optimizer: torch.optim.Optimizer) -> None:
    """The previous warm-up: each step at lr = 0, the configured lr put back afterwards."""
    for batch in batches:
        saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        with probe_pass_context(components.model, components.params):
            real_step(components, batch, 2, optimizer)
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = lr


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.Adam(params, lr=0.05, betas=(0.0, 0.999), weight_decay=0.1),
        lambda params: torch.optim.AdamW(params, lr=0.05, betas=(0.9, 0.99), weight_decay=0.1),
        lambda params: torch.optim.Adam(params, lr=0.05, amsgrad=True),
    ],
    ids=["adam-wd", "adamw-momentum", "adam-amsgrad"],
)
def test_warm_up_state_is_bit_identical_to_the_lr_zero_procedure_and_leaves_the_weights(make_optimizer):
    gen = torch.Generator().manual_seed(0)
    model = tiny_llama()
    batches = [token_count_reward_batch(model, PROMPTS, 4, T, gen, token=t) for t in (1, 2, 3)]
    weights_before = flat_params(model)
    optimizer = make_optimizer(model.parameters())
    warm_up_optimizer_state(ProbeComponents(model, {}), iter(batches), 2, optimizer)

    reference_model = tiny_llama()
    reference = make_optimizer(reference_model.parameters())
    _lr_zero_warm_up(ProbeComponents(reference_model, {}), batches, reference)

    assert torch.equal(flat_params(model), weights_before)
    assert torch.equal(flat_params(reference_model), weights_before)
    assert [g["lr"] for g in optimizer.param_groups] == [0.05]
    assert all(p.grad is None for p in model.parameters())
    params, reference_params = list(model.parameters()), list(reference_model.parameters())
    assert len(optimizer.state) == len(reference.state) == len(params)
    for p, q in zip(params, reference_params, strict=True):
        state, expected = optimizer.state[p], reference.state[q]
        assert set(state) == set(expected)
        assert float(state["step"]) == float(expected["step"]) == 3.0
        for key in set(state) - {"step"}:
            assert torch.equal(state[key], expected[key]), key
    assert any(optimizer.state[p]["exp_avg_sq"].abs().max() > 0 for p in params)


@pytest.mark.parametrize(
    ("name", "cls"), [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)]
)
def test_build_optimizer_reads_the_config(name, cls):
    cfg = OmegaConf.create({"name": name, "lr": 3e-4, "betas": [0.5, 0.9], "eps": 1e-6, "weight_decay": 0.01})
    params = list(tiny_llama().parameters())
    optimizer = build_optimizer(cfg, params)
    assert type(optimizer) is cls
    (group,) = optimizer.param_groups
    assert group["lr"] == 3e-4 and group["weight_decay"] == 0.01 and group["params"] == params
    if name == "sgd":
        assert group["momentum"] == 0
    else:
        assert group["betas"] == (0.5, 0.9) and group["eps"] == 1e-6
