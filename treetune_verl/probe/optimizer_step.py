# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The step the user's optimizer would take from a given gradient, computed on a float64 copy.

ΔH₁ = ⟨X̄, Δθ⟩ needs the update Δθ the optimizer makes from the gradient −Ȳ (the loss is −J) at its current state.
Rather than a closed form per optimizer family (Adam's bias correction at step 0 or 1, weight decay in its Adam-L2 and
AdamW forms, SGD momentum / nesterov, amsgrad, ``maximize``...), :func:`optimizer_step` runs the optimizer's own
``step()`` once: a new optimizer of the same class, with the same param-group settings and a copy of the current
state, over float64 copies of the parameters. The user's optimizer and parameters are only read. Any ``torch.optim``
optimizer is therefore exact, including a fresh Adam whose first step is lr·Ȳ/(|Ȳ| + eps) elementwise.

Why float64: Δθ is read as θ' − θ. At the probe's learning rates Δθ is 1e-7 of θ or smaller, below float32's
resolution of θ (a relative error of percents, measured); in float64 the difference is exact to ~1e-9 of Δθ.

Memory: one float64 copy of the probed parameters and of the optimizer state for the duration of the call.
"""

from __future__ import annotations

import torch

ParamBuffer = dict[str, torch.Tensor]

# Implementation switches of torch's optimizers that do not apply to a CPU/float64 copy (they change no result).
_IMPLEMENTATION_KEYS = {"foreach": False, "fused": None, "capturable": False, "differentiable": False}


def params_without_state(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> int:
    """How many of ``params`` the optimizer holds no state for yet (never stepped)."""
    return sum(1 for p in params if not optimizer.state.get(p))


def _copied_state(optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()`` with every state tensor copied to the CPU (floating ones as float64, except the
    step counters, which torch keeps in their own dtype). ``load_state_dict`` alone would share the tensors it does
    not need to cast, and the copy's step would then move the user's state."""
    state_dict = optimizer.state_dict()

    def copied(key: str, value: object) -> object:
        if not isinstance(value, torch.Tensor):
            return value
        floating = value.is_floating_point() and key != "step"
        return value.detach().to(device="cpu", dtype=torch.float64 if floating else value.dtype, copy=True)

    state = {
        index: {key: copied(key, value) for key, value in entry.items()} for index, entry in state_dict["state"].items()
    }
    return {"state": state, "param_groups": state_dict["param_groups"]}


@torch.no_grad()
def optimizer_step(
    optimizer: torch.optim.Optimizer,
    named_params: list[tuple[str, torch.nn.Parameter]],
    gradient: ParamBuffer,
    out_dtype: torch.dtype,
    out_device: torch.device,
) -> ParamBuffer:
    """Δθ of one ``optimizer.step()`` with ``.grad = gradient`` (keyed by parameter name), on float64 copies.

    Args:
        optimizer: the optimizer whose next step is wanted; only read.
        named_params: ``(name, parameter)`` pairs of the probed parameters.
        gradient: the loss gradient per parameter name, shaped like the parameter; a parameter of the optimizer
            without an entry gets no gradient (as in a real step, it is then not updated).
        out_dtype, out_device: of the returned Δθ tensors.

    Returns:
        Δθ keyed by the names in ``gradient``.

    Raises:
        ValueError: a named parameter the optimizer does not hold.
    """
    name_of = {id(p): name for name, p in named_params}
    copies: dict[int, torch.nn.Parameter] = {}
    groups = []
    for group in optimizer.param_groups:
        params = []
        for p in group["params"]:
            copy = torch.nn.Parameter(p.detach().to(device="cpu", dtype=torch.float64).clone())
            name = name_of.get(id(p))
            if name is not None and name in gradient:
                copy.grad = gradient[name].detach().to(device="cpu", dtype=torch.float64).clone()
            copies[id(p)] = copy
            params.append(copy)
        groups.append({"params": params})
    missing = [name for name, p in named_params if id(p) not in copies and name in gradient]
    if missing:
        raise ValueError(f"optimizer_step: parameters {missing[:5]} are not in the optimizer's param_groups")
    # The constructor's defaults are placeholders: load_state_dict sets every group's settings to the user's (some
    # group keys, e.g. AdamW's decoupled_weight_decay, are not constructor arguments), and the state, by index in
    # param_groups order, which the copies follow.
    shadow = type(optimizer)(groups)
    shadow.load_state_dict(_copied_state(optimizer))
    for group in shadow.param_groups:
        group.update({key: value for key, value in _IMPLEMENTATION_KEYS.items() if key in group})
    shadow.step()
    return {
        name: (copies[id(p)].detach() - p.detach().to(device="cpu", dtype=torch.float64)).to(
            device=out_device, dtype=out_dtype
        )
        for name, p in named_params
        if name in gradient
    }
