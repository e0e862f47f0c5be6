# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``optimizer_step``: Δθ equals the optimizer's real next step for every family and state, and nothing of the user's
optimizer or parameters moves. References are real ``optimizer.step()`` calls on a float64 model."""

from __future__ import annotations

import copy

import pytest
import torch

from treetune_verl.probe.optimizer_step import optimizer_step, params_without_state

FAMILIES = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2),
    "sgd_momentum_nesterov_wd": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adam_l2": lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.1),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
    "adam_amsgrad_maximize": lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True, maximize=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.5),
}


def _model_and_optimizer(family: str, steps: int, dtype=torch.float64):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).to(dtype)
    optimizer = FAMILIES[family](model.parameters())
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 4, dtype=dtype)).pow(2).sum().backward()
        optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


@pytest.mark.parametrize("steps", [0, 1, 5])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_equals_the_real_next_step_and_touches_nothing(family, steps):
    model, optimizer = _model_and_optimizer(family, steps)
    gradient = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    state_before = copy.deepcopy(optimizer.state_dict())
    delta = optimizer_step(optimizer, list(model.named_parameters()), gradient, torch.float64, torch.device("cpu"))
    # nothing of the user's moved: parameters, gradients, state
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) and p.grad is None
    after = optimizer.state_dict()
    for index, entry in state_before["state"].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(after["state"][index][key]), torch.as_tensor(value)), (index, key)
    stateless = steps == 0 or family == "sgd"  # plain SGD keeps no state at all
    assert params_without_state(optimizer, list(model.parameters())) == (4 if stateless else 0)
    # the real step from the same gradient
    for name, p in model.named_parameters():
        p.grad = gradient[name].clone()
    optimizer.step()
    for name, p in model.named_parameters():
        assert torch.equal(p.detach() - before[name], delta[name]), name


def test_float32_model_gets_the_float64_step():
    """At a small lr, θ' − θ read in float32 loses percents of Δθ; the float64 copy does not."""
    model, optimizer = _model_and_optimizer("sgd", 0, torch.float32)
    for group in optimizer.param_groups:
        group["lr"] = 1e-7
    gradient = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    delta = optimizer_step(optimizer, list(model.named_parameters()), gradient, torch.float64, torch.device("cpu"))
    for name, _ in model.named_parameters():
        exact = -1e-7 * gradient[name].double()  # SGD: Δθ = -lr·g
        assert torch.allclose(delta[name], exact, rtol=1e-6, atol=0)
    float32_delta = {}
    for name, p in model.named_parameters():
        old = p.detach().clone()
        float32_delta[name] = (old - 1e-7 * gradient[name]) - old  # what reading θ' − θ in float32 gives
    worst = max(float(((float32_delta[n].double() - delta[n]) / delta[n]).abs().max()) for n in delta)
    assert worst > 1e-3, worst  # the precision the float64 copy exists for


def test_refuses_parameters_outside_the_optimizer():
    model, optimizer = _model_and_optimizer("adam", 1)
    stranger = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="not in the optimizer's param_groups"):
        optimizer_step(
            optimizer, [("stranger", stranger)], {"stranger": torch.ones(2)}, torch.float64, torch.device("cpu")
        )
