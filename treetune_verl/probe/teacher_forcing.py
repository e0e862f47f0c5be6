# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Teacher-forced per-token log-probabilities and entropies of the sampling policy on a probe (micro)batch.

Shape notation:
    b = prompts in the microbatch, G = responses per prompt, T = row width
    R = T - P response columns (P = common response start column, see ``batch.py``)
    V = vocabulary size

Units: log-probabilities and entropies in nats, per token, computed in fp32 (``policy.py``). Padding positions hold 0.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from treetune_verl.probe.policy import entropy_from_log_probs, policy_log_probs


@dataclass
class TeacherForced:
    """Per-token results, all ``[b, G, R]`` fp32 (mask bool), zero at padding."""

    token_logprobs: torch.Tensor  # log π(y_j | s_j)
    entropies: torch.Tensor | None  # H_j = H(π(·|s_j)); None unless requested
    response_mask: torch.Tensor  # True on response tokens


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP / FSDP-style wrapper (anything with a ``module`` attribute that is a Module)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (unwrapped) model's forward takes HF's ``logits_to_keep`` argument."""
    try:
        return "logits_to_keep" in inspect.signature(unwrap_model(model).forward).parameters
    except (TypeError, ValueError):
        return False


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: ``[N, T]`` mask -> ``[N, T]`` long, 0 at the first real token.

    HF causal LMs default to ``arange(T)`` positions, which would shift every left-padded prompt; generation in
    ``sampling.py`` uses the same rule, so sampling and teacher forcing see identical positions.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def teacher_force(
    model: torch.nn.Module,
    mb: dict[str, torch.Tensor],
    response_col: int,
    temperature: float,
    top_p: float,
    with_entropy: bool,
    allow_zero_probability: bool = False,
) -> TeacherForced:
    """One forward pass over all ``b·G`` rows of a microbatch (grad enabled unless the caller disables it).

    Args:
        model: HF-style causal LM: ``model(input_ids=, attention_mask=, position_ids=)`` returns ``.logits``.
        mb: probe (micro)batch, CPU or device tensors.
        response_col: the common response column P.
        temperature, top_p: the sampling policy (``policy.py``).
        with_entropy: also return the per-position entropies H_j (differentiable).
        allow_zero_probability: give a response token outside the top-p nucleus log-probability -inf instead of
            raising (the ground truth after a step, where a sampled token may have left the nucleus of θ′).

    Raises:
        ValueError: unless ``allow_zero_probability``, if a response token lies outside the top-p nucleus
            (probability 0 under the policy), which means the responses were not sampled with this temperature/top_p.
    """
    device = next(model.parameters()).device
    seq = mb["sequences"].to(device, non_blocking=True)
    mask = mb["attention_masks"].to(device, non_blocking=True)
    b, G, T = seq.shape
    R = T - response_col
    flat_seq = seq.view(b * G, T)
    flat_mask = mask.view(b * G, T)
    kwargs = {"input_ids": flat_seq, "attention_mask": flat_mask, "position_ids": position_ids_from_mask(flat_mask)}
    if accepts_logits_to_keep(model):
        # Only the R columns that predict response tokens (P-1 .. T-2) need the vocabulary projection.
        logits = model(**kwargs, logits_to_keep=R + 1, use_cache=False).logits[:, :R]
    else:
        logits = model(**kwargs).logits[:, response_col - 1 : T - 1]
    log_probs, keep = policy_log_probs(logits, temperature, top_p)  # [N, R, V]
    targets = flat_seq[:, response_col:]  # [N, R]
    resp_mask = flat_mask[:, response_col:].bool()  # [N, R]
    token_lp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, R]
    if not allow_zero_probability and torch.isneginf(token_lp[resp_mask]).any():
        raise ValueError(
            "a response token has probability 0 under the policy (outside the top-p nucleus): the responses were "
            f"not sampled with temperature={temperature}, top_p={top_p}, or the logits differ from sampling time"
        )
    token_lp = token_lp.masked_fill(~resp_mask, 0.0)
    entropies = None
    if with_entropy:
        entropies = entropy_from_log_probs(log_probs, keep).masked_fill(~resp_mask, 0.0).view(b, G, R)
    return TeacherForced(token_lp.view(b, G, R), entropies, resp_mask.view(b, G, R))
