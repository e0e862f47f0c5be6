# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``adam_sensitivity``: the controller's entropy step against torch's own optimizer.

Reference, independent of the code under test: torch's real ``Adam`` / ``AdamW`` step taken from copies of the same
model and optimizer state with the loss ``L − c · H`` at ``c = ±δ`` (float64), the central difference of the weights it
leaves, ``(θ′(δ) − θ′(−δ)) / 2δ`` = ``∂Δθ/∂c``. The module's ``k ⊙ ∇H`` (``k`` read after the plain step with ``L``)
must equal it; without the second-moment term it would not (checked: the test can fail).
"""

from __future__ import annotations

import copy

import pytest
import torch

from treetune_verl.control.adam_sensitivity import entropy_step, step_sensitivity

DELTA = 1e-5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).double()


X = torch.linspace(-1.0, 1.0, 20, dtype=torch.float64).reshape(5, 4)


def _loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    """A different objective each step (the moments see varied gradients)."""
    return ((model(X) - 0.3 * step) ** 2).mean()


def _entropy(model: torch.nn.Module) -> torch.Tensor:
    """Mean entropy of the softmax of the model's outputs: the ``H`` the coefficient ascends."""
    logp = torch.log_softmax(model(X), dim=-1)
    return -(logp.exp() * logp).sum(-1).mean()


def _warmed(optimizer_cls, steps: int, **options):
    model = _model()
    optimizer = optimizer_cls(model.parameters(), lr=1e-2, **options)
    for step in range(steps):
        optimizer.zero_grad()
        _loss(model, step).backward()
        optimizer.step()
    return model, optimizer


def _stepped(model, optimizer, step: int, c: float):
    """Copies of ``model`` and ``optimizer`` after one real step on ``L − c · H``; the copy's parameters."""
    model, optimizer = copy.deepcopy((model, optimizer))
    optimizer.zero_grad()
    (_loss(model, step) - c * _entropy(model)).backward()
    optimizer.step()
    return [p.detach().clone() for p in model.parameters()], model, optimizer


CASES = {
    # Adam's first step is lr · sign(g) per element (m̂ / √v̂ = g / |g|): the two terms cancel, the step does not
    # respond to the gradient's size; only the ε-level remainder is left (|∂Δθ/∂c| ~ 1e-6 here against ~1e-3 later)
    "adam-first-step": (torch.optim.Adam, 0, {}),
    "adam-step-6": (torch.optim.Adam, 5, {}),
    "adamw-step-6-decay": (torch.optim.AdamW, 5, {"weight_decay": 0.1}),
    "adamw-foreach-off": (torch.optim.AdamW, 3, {"foreach": False, "betas": (0.8, 0.99)}),
}


@pytest.mark.parametrize("case", CASES)
def test_entropy_step_is_the_derivative_of_torchs_own_step(case):
    optimizer_cls, warm_steps, options = CASES[case]
    model, optimizer = _warmed(optimizer_cls, warm_steps, **options)
    plus, *_ = _stepped(model, optimizer, warm_steps, DELTA)
    minus, *_ = _stepped(model, optimizer, warm_steps, -DELTA)
    reference = [(a - b) / (2 * DELTA) for a, b in zip(plus, minus, strict=True)]

    # the module: the plain step, then k from its state, applied to ∇H at the weights the step started from
    h = torch.autograd.grad(_entropy(model), list(model.parameters()))
    _, stepped_model, stepped_optimizer = _stepped(model, optimizer, warm_steps, 0.0)
    k = step_sensitivity(stepped_optimizer)
    params = list(stepped_model.parameters())
    got = entropy_step(k, dict(zip(params, h, strict=True)))
    error = max((got[p] - r).abs().max().item() for p, r in zip(params, reference, strict=True))

    # the test can fail: the first term alone (the second moment's dependence on c dropped) is measurably off
    first_only = []
    for group in stepped_optimizer.param_groups:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            state = stepped_optimizer.state[p]
            t = float(state["step"])
            u = state["exp_avg_sq"].sqrt() / (1 - beta2**t) ** 0.5 + group["eps"]
            first_only.append(group["lr"] / (1 - beta1**t) * (1 - beta1) / u)
    scale = max((f * g).abs().max().item() for f, g in zip(first_only, h, strict=True))  # the first term's size
    assert error <= 1e-6 * scale, f"{case}: |k ⊙ ∇H − ∂Δθ/∂c| = {error:.3g}, first term {scale:.3g}"
    naive = max((f * g - r).abs().max().item() for f, g, r in zip(first_only, h, reference, strict=True))
    assert naive > 100 * error and naive > 1e-4 * scale, f"{case}: the second-moment term made no difference"


def test_refusals_name_what_is_not_supported():
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="Adam / AdamW; got SGD"):
        step_sensitivity(sgd)
    for option in ("amsgrad", "maximize"):
        model, optimizer = _warmed(torch.optim.Adam, 1, **{option: True})
        with pytest.raises(ValueError, match=f"{option}=True"):
            step_sensitivity(optimizer)
    model, optimizer = _warmed(torch.optim.Adam, 1, weight_decay=0.1)
    with pytest.raises(ValueError, match="coupled weight_decay=0.1"):
        step_sensitivity(optimizer)
    model = _model()
    optimizer = torch.optim.Adam(model.parameters())
    _entropy(model).backward()  # a gradient, but no step taken
    with pytest.raises(ValueError, match="no Adam state"):
        step_sensitivity(optimizer)
    model, optimizer = _warmed(torch.optim.Adam, 1)
    k = step_sensitivity(optimizer)
    stranger = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="took no step"):
        entropy_step(k, {stranger: torch.ones(2)})
