# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast tests' independent reference: the realised entropy change of E's sampled responses from plain HF
forwards (log-softmax, per-token entropies, importance weights and the leave-one-out control variate written out
here: no product code), and E's probe batches read back as token lists."""

from __future__ import annotations

import math

import torch

from treetune_verl.probe.batch import make_probe_batch


@torch.no_grad()
def sequence_stats(model: torch.nn.Module, prompt: list[int], response: list[int]) -> tuple[float, float]:
    """(log π(response | prompt), Σ_t H_t nats over the response's positions) from one HF forward at T = 1."""
    ids = torch.tensor([prompt + response])
    logits = model.eval()(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()  # the positions predicting y
    log_p = torch.log_softmax(logits, dim=-1)
    S = log_p.gather(-1, torch.tensor(response)[:, None]).sum()
    F = -(log_p.exp() * log_p).sum()
    return float(S), float(F)


def realised_change(
    before: torch.nn.Module,
    after: torch.nn.Module,
    prompts: list[list[int]],
    responses: list[list[list[int]]],
    budget: int,
) -> torch.Tensor:
    """Per prompt, (Ĥ(θ′) − Ĥ(θ)) / ``budget`` from the responses sampled at θ: Ĥ(θ) = mean_g F_θ, Ĥ(θ′) = mean_g
    [w_g F_θ′ − (w_g − 1) · mean_{g′≠g} F_θ′[g′]] with w_g = π_θ′(y_g) / π_θ(y_g) (unbiased importance weights with
    a leave-one-out control variate)."""
    changes = []
    for prompt, group in zip(prompts, responses, strict=True):
        S0, F0 = zip(*[sequence_stats(before, prompt, y) for y in group], strict=True)
        S1, F1 = zip(*[sequence_stats(after, prompt, y) for y in group], strict=True)
        w = [math.exp(s1 - s0) for s0, s1 in zip(S0, S1, strict=True)]
        G = len(group)
        others = [(sum(F1) - f) / (G - 1) for f in F1]
        h_after = sum(w[g] * F1[g] - (w[g] - 1) * others[g] for g in range(G)) / G
        changes.append((h_after - sum(F0) / G) / budget)
    return torch.tensor(changes, dtype=torch.float64)


def token_lists(batches: list[dict[str, torch.Tensor]]) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The ranks' E shares as token lists: prompts ``[B]`` and responses ``[B][G]`` (read back from the layout of
    ``probe/batch.py``: left-padded prompt, right-padded responses, attention mask)."""
    prompts, responses = [], []
    for E in batches:
        seq, mask = E["sequences"], E["attention_masks"].bool()
        for b in range(seq.shape[0]):
            start = int(mask[b, 0].long().argmax())
            P = start + int(E["prompt_lens"][b])
            prompts.append(seq[b, 0, start:P].tolist())
            responses.append([seq[b, g, P:][mask[b, g, P:]].tolist() for g in range(seq.shape[1])])
    return prompts, responses


def joined(
    batches: list[dict[str, torch.Tensor]], G: int, budget: int, pad_token_id: int = 0
) -> dict[str, torch.Tensor]:
    """The ranks' E shares as one probe batch (``G`` responses per prompt, L_max = ``budget``)."""
    prompts, responses = token_lists(batches)
    B = len(prompts)
    return make_probe_batch(prompts, responses, torch.zeros(B, G), pad_token_id, [budget] * B)
