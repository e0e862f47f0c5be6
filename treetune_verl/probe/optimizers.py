# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The optimizer whose next step the main job probes: ``build_optimizer`` and the Adam state warm-up.

On the probe's path this comes right after the model is loaded and before any batch is scored: the optimizer's lr is
the lr of ΔH₁, its next step from −Ȳ at its current state is Δθ (``optimizer_step.py``), and its real step is the
ground truth. A fresh Adam's first step differs from later ones (no second moments yet: lr·g/(|g| + eps)); to probe
a state like a training run's, ``warm_up_optimizer_state`` first populates it with real steps on batches of their
own, each undone on the weights (``ground_truth.temporary_step``), so the probed step starts from the same θ with a
state that has seen ``optimizer.state_warmup_batches`` gradients.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from omegaconf import DictConfig

from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.ground_truth import temporary_step


def build_optimizer(cfg_opt: DictConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """SGD (no momentum) or Adam/AdamW with the configured betas, eps and weight decay (``optimizer.*``)."""
    lr = float(cfg_opt.lr)
    if cfg_opt.name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=float(cfg_opt.weight_decay))
    kwargs = {"lr": lr, "betas": tuple(float(b) for b in cfg_opt.betas), "eps": float(cfg_opt.eps)}
    if cfg_opt.name == "adam":
        return torch.optim.Adam(params, weight_decay=float(cfg_opt.weight_decay), **kwargs)
    return torch.optim.AdamW(params, weight_decay=float(cfg_opt.weight_decay), **kwargs)


def state_step(optimizer: torch.optim.Optimizer) -> int | None:
    """Steps the optimizer's state has seen (the largest per-parameter ``step``); ``None`` if it keeps no count."""
    steps = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
    return max(steps) if steps else None


def warm_up_optimizer_state(
    components: ProbeComponents,
    batches: Iterable[dict[str, torch.Tensor]],
    mb_size_prompts: int,
    optimizer: torch.optim.Optimizer,
) -> None:
    """One real step per batch at the configured lr, weights restored after each; the optimizer state is kept.

    Each gradient is taken at the same θ, and Adam/AdamW's moments and step count do not depend on lr, so the state
    equals that of steps at lr = 0 (the weights then never move). ``batches`` may be a lazy iterable: each batch is
    drawn after the previous step was undone.
    """
    for batch in batches:
        with temporary_step(components, batch, mb_size_prompts, optimizer, keep_optimizer_state=True):
            pass  # only the step's effect on the optimizer state is wanted
