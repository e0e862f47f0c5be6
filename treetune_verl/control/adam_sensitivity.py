# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""How the step torch's Adam / AdamW just took moves when a term ``−c · h`` is added to the loss's gradient: the
direction ``Δθ_H`` of the controller (``Δθ(c) = Δθ_J + c · Δθ_H`` to first order in ``c``).

The entropy bonus ``L − c · H`` adds ``−c · ∇H`` to the gradient ``g`` the step used. torch's Adam step at count t
(``torch/optim/adam.py``, ``_single_tensor_adam``; AdamW's decoupled decay multiplies θ first and does not depend on
``c``) is ``Δθ = −s · m_t / u`` with

    m_t = β₁ m + (1 − β₁) g,   v_t = β₂ v + (1 − β₂) g²,   s = lr / (1 − β₁ᵗ),   u = √v_t / √(1 − β₂ᵗ) + ε.

With ``g → g − c h`` both moments move: ``∂m_t/∂c = −(1 − β₁) h`` and ``∂v_t/∂c = −2 (1 − β₂) g h``, so

    ∂Δθ/∂c = s · [ (1 − β₁) / u − m_t (1 − β₂) g / (u² √v_t √(1 − β₂ᵗ)) ] ⊙ h  =  k ⊙ h.

The second term is the step's own gradient in the second moment: about ``1/t`` of the first while ``t ≪ 1/(1 − β₂)``
(v̂ is then about the mean of the squared gradients so far), so a run's first updates need it; it is exact here, not
dropped. ``k`` depends on the step only (its gradient, moments and count), so it is taken right after the step
(:func:`step_sensitivity`), while ``p.grad`` still holds the gradient the step used, and applied to any ``h`` later.

What is not in it: verl clips the gradient's norm before the step; an entropy coefficient inside verl's loss would be
clipped with it, ``c · Δθ_H`` added after the step is not (the controller's step is its own, bounded by
``max_coefficient``).

Where an element has seen almost no gradient (``v_t`` ≈ 0: an embedding row of a token no batch held), ``u ≈ ε`` and
the derivative ``h / ε`` is not what Adam does: once ``c·h`` outgrows the element's own gradient, its step saturates at
about ``lr · sign(h)``, whatever ``c``. A first-order controller cannot steer through that, so the entropy step floors
``√v_t`` at :data:`FLOOR_SHARE` of the tensor's RMS there (and drops the second-moment term, whose ``g`` is ≈ 0): the
step is Adam's wherever Adam is linear in ``c``, and a bounded one elsewhere.

Shapes: one ``k`` per parameter, like the parameter's local shard (FSDP2: this rank's shard; the optimizer's state and
the gradient are sharded alike, so ``k ⊙ h`` is elementwise on shards). Units: ``k`` is parameter change per unit of
``c · h``.
"""

from __future__ import annotations

import math

import torch

from treetune_verl.forecast.sharding import local_tensor

# Elements whose √v_t is below this share of their tensor's RMS √v_t have seen almost no gradient: Adam's response to
# c·h there is not linear in c (h / ε to first order, about lr·sign(h) once c·h dominates), so the entropy step takes
# the floor's scale there (module docstring). 1 %: v_t four orders of magnitude below the tensor's mean.
FLOOR_SHARE = 0.01
SUPPORTED = (torch.optim.Adam, torch.optim.AdamW)  # AdamW subclasses Adam in torch 2.13; both named for the message


def _hyperparameters(optimizer: torch.optim.Optimizer, group: dict) -> tuple[float, float, float, float]:
    """``(lr, β₁, β₂, ε)`` of one parameter group; refuses the variants whose step is another formula."""
    for option in ("amsgrad", "maximize", "differentiable"):
        if group.get(option):
            raise ValueError(f"entropy control: {type(optimizer).__name__} with {option}=True is not supported")
    if group.get("weight_decay", 0.0) and not group.get("decoupled_weight_decay", False):
        # the coupled decay adds λθ (θ before the step, gone after it) to the gradient the moments saw
        raise ValueError(
            f"entropy control: {type(optimizer).__name__} with coupled weight_decay={group['weight_decay']} is not "
            "supported (AdamW's decoupled decay is, verl's default)"
        )
    lr = group["lr"]
    lr = float(lr.item() if isinstance(lr, torch.Tensor) else lr)
    beta1, beta2 = (float(b.item() if isinstance(b, torch.Tensor) else b) for b in group["betas"])
    return lr, beta1, beta2, float(group["eps"])


@torch.no_grad()
def step_sensitivity(
    optimizer: torch.optim.Optimizer, floor_share: float = FLOOR_SHARE
) -> dict[torch.Tensor, torch.Tensor]:
    """``k`` for every parameter the optimizer's last step moved (module docstring), float64, like the parameter's
    local shard; call right after ``optimizer.step()``, before the gradients are cleared. Elements whose √v_t is
    below ``floor_share`` of their tensor's RMS √v_t take the floor instead (:data:`FLOOR_SHARE`).

    Raises:
        TypeError: the optimizer is not torch's Adam or AdamW.
        ValueError: a variant with another step formula (amsgrad, maximize, Adam's coupled weight decay), or a parameter with a gradient the
            optimizer has no state for (the step was not taken).
    """
    if not isinstance(optimizer, SUPPORTED):
        raise TypeError(
            f"entropy control: the entropy's step is derived for torch.optim.Adam / AdamW; got {type(optimizer).__name__}"
        )
    sensitivity: dict[torch.Tensor, torch.Tensor] = {}
    for group in optimizer.param_groups:
        lr, beta1, beta2, eps = _hyperparameters(optimizer, group)
        for p in group["params"]:
            if p.grad is None:
                continue
            state = optimizer.state.get(p)
            if not state or "exp_avg_sq" not in state:
                raise ValueError(
                    "entropy control: a parameter has a gradient but no Adam state: the step was not taken"
                )
            step = state["step"]
            t = float(step.item() if isinstance(step, torch.Tensor) else step)
            g = local_tensor(p.grad).detach().double()  # the gradient the step used (AdamW's decay is not in it)
            m = local_tensor(state["exp_avg"]).detach().double()
            v = local_tensor(state["exp_avg_sq"]).detach().double()
            correction2 = math.sqrt(1.0 - beta2**t)
            root_v = v.sqrt()
            s = lr / (1.0 - beta1**t)
            # Where an element has seen (almost) no gradient, u ≈ ε and the first-order response h / ε is not Adam's:
            # once c·h outgrows the element's own gradient its step saturates at about lr·sign(h). There the step uses
            # the floor (a share of its tensor's RMS second moment) and has no second-moment term (g ≈ 0 there).
            floor = floor_share * float(v.mean().sqrt()) if v.numel() else 0.0
            linear = root_v >= floor
            u = torch.where(linear, root_v, floor) / correction2 + eps
            # g = 0 where v_t = 0 (v_t ≥ (1 − β₂) g²): the second term is 0 there, not 0/0
            second = torch.where(
                linear & (root_v > 0), m * (1.0 - beta2) * g / (u * u * root_v.clamp_min(1e-300) * correction2), 0.0
            )
            sensitivity[p] = s * ((1.0 - beta1) / u - second)
    return sensitivity


def entropy_step(sensitivity: dict[torch.Tensor, torch.Tensor], entropy_gradient: dict[torch.Tensor, torch.Tensor]):
    """``Δθ_H = k ⊙ ∇H`` per parameter (local shards, float64): the first-order change of the step per unit of the
    entropy coefficient. ``entropy_gradient``: ``∇H`` of the entropy the coefficient ascends, per parameter (local
    shard); a parameter without one (no path to the entropy) does not move."""
    missing = [p for p in entropy_gradient if p not in sensitivity]
    if missing:
        raise ValueError(f"entropy control: {len(missing)} parameters have an entropy gradient but took no step")
    return {p: sensitivity[p] * local_tensor(h).detach().double() for p, h in entropy_gradient.items()}
