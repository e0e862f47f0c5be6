# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Sample G responses per prompt from an HF causal LM under the probe's policy (temperature, top-p).

The next-token distribution is ``policy.policy_log_probs`` applied to the last-position logits, the same function
teacher forcing uses, with the same position ids (left padding ignored); only the KV cache differs, which changes
logits at the 1e-6 level. Sampling stops at an EOS token (kept as the response's last token) or after
``max_new_tokens`` tokens.

Shape notation:
    N = rows sampled together (prompts × G, chunked by ``batch_size``), V = vocabulary size
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from treetune_verl.probe.policy import check_policy_args, policy_log_probs
from treetune_verl.probe.teacher_forcing import accepts_logits_to_keep, position_ids_from_mask, unwrap_model


@torch.no_grad()
def _sample_chunk(
    model: torch.nn.Module,
    prompts: list[list[int]],
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    eos_token_ids: frozenset[int],
    pad_token_id: int,
    generator: torch.Generator,
    stop_early: bool,
) -> tuple[list[list[int]], list[list[float]]]:
    device = next(model.parameters()).device
    N = len(prompts)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((N, width), pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros((N, width), dtype=torch.long, device=device)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.as_tensor(prompt, device=device)
        mask[i, width - len(prompt) :] = 1
    positions = position_ids_from_mask(mask)
    # Only the last position's logits are needed; a full [N, width, V] prefill would dominate peak memory.
    extra = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra)
    logits, past = out.logits[:, -1], out.past_key_values  # [N, V]
    next_pos = positions[:, -1:] + 1  # [N, 1]

    step_tokens, step_logprobs, step_alive = [], [], []  # per step: [N] each
    finished = torch.zeros(N, dtype=torch.bool, device=device)
    eos = torch.tensor(sorted(eos_token_ids), dtype=torch.long, device=device)
    for step in range(max_new_tokens):
        log_probs, _ = policy_log_probs(logits, temperature, top_p)  # [N, V] fp32
        token = torch.multinomial(log_probs.exp(), 1, generator=generator)  # [N, 1]
        step_tokens.append(token.squeeze(-1))
        step_logprobs.append(log_probs.gather(-1, token).squeeze(-1))
        step_alive.append(~finished)
        finished = finished | torch.isin(token.squeeze(-1), eos)
        if (stop_early and bool(finished.all())) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones((N, 1), dtype=mask.dtype, device=device)], dim=1)
        out = model(input_ids=token, attention_mask=mask, position_ids=next_pos, past_key_values=past, use_cache=True)
        logits, past = out.logits[:, -1], out.past_key_values
        next_pos = next_pos + 1

    all_tokens = torch.stack(step_tokens, dim=1).tolist()  # [N, steps]
    all_logprobs = torch.stack(step_logprobs, dim=1).tolist()
    alive = torch.stack(step_alive, dim=1).sum(dim=1).tolist()  # tokens kept per row (through its EOS)
    tokens = [row[:n] for row, n in zip(all_tokens, alive, strict=True)]
    logprobs = [row[:n] for row, n in zip(all_logprobs, alive, strict=True)]
    return tokens, logprobs


def sample_responses(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    G: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    pad_token_id: int,
    eos_token_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
    batch_size: int = 64,
    stop_early: bool = True,
) -> tuple[list[list[list[int]]], list[list[list[float]]]]:
    """G responses per prompt: ``(response_ids[b][g], token_logprobs[b][g])`` (logprobs in nats, fp32 values).

    Runs in eval mode (restored after). ``generator`` must live on the model's device; ``None`` uses torch's
    default generator. ``stop_early=False`` runs all ``max_new_tokens`` forward passes of a chunk even when every row
    has ended (the tokens after an EOS are dropped as before): under FSDP every rank must run the same number of
    forwards, whatever its own rows sampled.
    """
    check_policy_args(temperature, top_p)
    if G < 1 or max_new_tokens < 1:
        raise ValueError(f"sample_responses needs G >= 1 and max_new_tokens >= 1, got G={G}, {max_new_tokens=}")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("sample_responses: a prompt is empty")
    inner = unwrap_model(model)
    rows = [list(p) for p in prompt_ids for _ in range(G)]
    tokens: list[list[int]] = []
    logprobs: list[list[float]] = []
    was_training = inner.training
    inner.eval()
    try:
        for start in range(0, len(rows), batch_size):
            t, lp = _sample_chunk(
                inner,
                rows[start : start + batch_size],
                temperature,
                top_p,
                max_new_tokens,
                frozenset(eos_token_ids),
                pad_token_id,
                generator,
                stop_early,
            )
            tokens += t
            logprobs += lp
    finally:
        inner.train(was_training)
    B = len(prompt_ids)
    return (
        [tokens[b * G : (b + 1) * G] for b in range(B)],
        [logprobs[b * G : (b + 1) * G] for b in range(B)],
    )
