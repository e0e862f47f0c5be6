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
    # [T, V] fp32 CPU: the policy's log-probabilities over the vocabulary at the T response tokens (in the order of
    # ``response_mask.nonzero()``); None unless requested (``keep_log_probs``: the forecast exact in the softmax)
    log_probs: torch.Tensor | None = None


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP / FSDP-style wrapper (anything with a ``module`` attribute that is a Module)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


# A second forward reads every weight once more (and under FSDP gathers them again). Shared / whole rows on SmolLM2
# (FSDP2, one CPU thread, treetune_tests/treetune_verl/forecast/bench_token_values.py): 32 prompt tokens saved 1.19x
# [1.03, 1.27], 96 saved 0.99x [0.95, 1.03], 384 saved 0.66x [0.61, 0.72], 768 saved 0.75x [0.67, 0.81].
MIN_SHARED_PROMPT_TOKENS = 64


def forward_parameters(model: torch.nn.Module) -> set[str]:
    """Names of the (unwrapped) model's forward parameters (empty when its signature cannot be read)."""
    try:
        return set(inspect.signature(unwrap_model(model).forward).parameters)
    except (TypeError, ValueError):
        return set()


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (unwrapped) model's forward takes HF's ``logits_to_keep`` argument."""
    return "logits_to_keep" in forward_parameters(model)


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
    share_prompt: bool = False,
    keep_log_probs: bool = False,
) -> TeacherForced:
    """One forward pass over all ``b·G`` rows of a microbatch (grad enabled unless the caller disables it), two with
    ``share_prompt``.

    Args:
        model: HF-style causal LM: ``model(input_ids=, attention_mask=, position_ids=)`` returns ``.logits``.
        mb: probe (micro)batch, CPU or device tensors.
        response_col: the common response column P.
        temperature, top_p: the sampling policy (``policy.py``).
        with_entropy: also return the per-position entropies H_j (differentiable).
        allow_zero_probability: give a response token outside the top-p nucleus log-probability -inf instead of
            raising (the ground truth after a step, where a sampled token may have left the nucleus of θ′).
        share_prompt: compute each prompt once for its G responses (KV cache, see :func:`_response_logits`); the
            forecast's forwards without graph use it.
        keep_log_probs: also return the full-vocabulary log-probabilities at the response tokens (detached, on the
            CPU: T × V × 4 bytes).

    Raises:
        ValueError: unless ``allow_zero_probability``, if a response token lies outside the top-p nucleus
            (probability 0 under the policy), which means the responses were not sampled with this temperature/top_p.
    """
    device = next(model.parameters()).device
    seq = mb["sequences"].to(device, non_blocking=True)
    mask = mb["attention_masks"].to(device, non_blocking=True)
    b, G, T = seq.shape
    R = T - response_col
    rows_mask = mask.view(b * G, T)
    resp_mask = rows_mask[:, response_col:].bool()  # [N, R]
    # Columns that are padding in every row change nothing at the others (left: masked out, positions count real
    # tokens; right: after every real token): the forward skips them, their values are 0 like any padding's.
    start, end = _real_columns(rows_mask, response_col)
    flat_seq = seq.view(b * G, T)[:, start:end]
    flat_mask = rows_mask[:, start:end]
    logits = _response_logits(model, flat_seq, flat_mask, response_col - start, G if share_prompt else 1)
    log_probs, keep = policy_log_probs(logits, temperature, top_p)  # [N, R', V], R' = end - P
    targets = flat_seq[:, response_col - start :]  # [N, R']
    token_lp = _padded(log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1), R)  # [N, R]
    if not allow_zero_probability and torch.isneginf(token_lp[resp_mask]).any():
        raise ValueError(
            "a response token has probability 0 under the policy (outside the top-p nucleus): the responses were "
            f"not sampled with temperature={temperature}, top_p={top_p}, or the logits differ from sampling time"
        )
    token_lp = token_lp.masked_fill(~resp_mask, 0.0)
    entropies = None
    if with_entropy:
        entropies = _padded(entropy_from_log_probs(log_probs, keep), R).masked_fill(~resp_mask, 0.0).view(b, G, R)
    kept = log_probs.detach()[resp_mask[:, : log_probs.shape[1]]].cpu() if keep_log_probs else None  # [T, V]
    return TeacherForced(token_lp.view(b, G, R), entropies, resp_mask.view(b, G, R), kept)


def _real_columns(mask: torch.Tensor, response_col: int) -> tuple[int, int]:
    """``[start, end)``: the columns of a ``[N, T]`` mask from the first holding a real token in any row to the last
    one, keeping the column before ``response_col`` (it predicts the first response token) and at least one response
    column."""
    real = mask.bool().any(dim=0).nonzero().flatten().tolist()
    start = min(real[0], response_col - 1) if real else response_col - 1
    end = max(real[-1] + 1, response_col + 1) if real else response_col + 1
    return start, end


def _padded(values: torch.Tensor, width: int) -> torch.Tensor:
    """``[N, w]`` values right-padded with zeros to ``[N, width]``."""
    return torch.nn.functional.pad(values, (0, width - values.shape[-1]))


def _response_logits(
    model: torch.nn.Module, seq: torch.Tensor, mask: torch.Tensor, response_col: int, G: int
) -> torch.Tensor:
    """Logits at the columns that predict ``seq``'s response tokens (``response_col - 1 .. T - 2``): ``[N, R, V]``.

    With ``G`` > 1 consecutive rows that share their prompt columns (a probe batch's G responses to one prompt), a
    model that takes HF's KV cache, and at least ``MIN_SHARED_PROMPT_TOKENS`` prompt tokens saved, each prompt is
    computed once: one forward over the N / G prompts keeping their cache, repeated G times, then one over the N
    responses' columns (less the last, which predicts nothing); else one forward over the whole rows. Both give the
    same logits up to float rounding.
    """
    N, T = seq.shape
    R = T - response_col
    positions = position_ids_from_mask(mask)
    parameters = forward_parameters(model)
    if "logits_to_keep" not in parameters:
        logits = model(input_ids=seq, attention_mask=mask, position_ids=positions).logits
        return logits[:, response_col - 1 : T - 1]
    saved_tokens = (N - N // G) * response_col if G > 1 and N % G == 0 else 0
    if (
        saved_tokens < MIN_SHARED_PROMPT_TOKENS
        or "past_key_values" not in parameters
        or not _prompts_shared(seq, mask, response_col, G)
    ):
        return _whole_rows_logits(model, seq, mask, positions, R)
    prompt = model(
        input_ids=seq[::G, :response_col],
        attention_mask=mask[::G, :response_col],
        position_ids=positions[::G, :response_col],
        logits_to_keep=1,
        use_cache=True,
    )
    first = prompt.logits.repeat_interleave(G, dim=0)  # [N, 1, V]: predicts each row's first response token
    if R == 1:
        return first
    cache = prompt.past_key_values
    if not hasattr(cache, "batch_repeat_interleave"):  # a legacy tuple cache (no HF Cache object): whole rows
        return _whole_rows_logits(model, seq, mask, positions, R)
    cache.batch_repeat_interleave(G)
    rest = model(
        input_ids=seq[:, response_col : T - 1],
        attention_mask=mask[:, : T - 1],
        position_ids=positions[:, response_col : T - 1],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=0,  # all of them
    ).logits
    return torch.cat([first, rest], dim=1)


def _whole_rows_logits(
    model: torch.nn.Module, seq: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, R: int
) -> torch.Tensor:
    """One forward over whole rows; only the R columns that predict response tokens (P-1 .. T-2) get the vocabulary
    projection (HF's ``logits_to_keep``)."""
    return model(
        input_ids=seq, attention_mask=mask, position_ids=positions, logits_to_keep=R + 1, use_cache=False
    ).logits[:, :R]


def _prompts_shared(seq: torch.Tensor, mask: torch.Tensor, response_col: int, G: int) -> bool:
    """Whether each run of ``G`` consecutive rows holds one prompt (ids and mask of the columns before
    ``response_col``)."""
    N = seq.shape[0]
    ids, prompt_mask = seq[:, :response_col].view(N // G, G, -1), mask[:, :response_col].view(N // G, G, -1)
    return bool((ids == ids[:, :1]).all() and (prompt_mask == prompt_mask[:, :1]).all())
