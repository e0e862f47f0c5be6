# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast tests' independent reference: the realised entropy change of E's sampled responses from plain HF
forwards (log-softmax, per-token entropies, importance weights and the leave-one-out control variate written out
here: no product code), and E's probe batches read back as token lists."""

from __future__ import annotations

import math

import torch

from treetune_verl.forecast.settings import ForecastSettings
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.components import ProbeComponents


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, copied (a collective under FSDP2: every rank calls it)."""
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for name, p in model.named_parameters()
    }


def directional_reference(
    model: torch.nn.Module, E: dict[str, torch.Tensor], step: dict[str, torch.Tensor], settings: ForecastSettings
) -> dict[str, float]:
    """⟨X_b, Δθ⟩ per prompt b of E (X from the probe's backward passes on ``model`` at θ, T = 1; ``step`` = Δθ by
    parameter name, float64): per estimator the mean ``deltaH1/<e>`` and its standard error ``deltaH1_se/<e>``."""
    out = {}
    for estimator in settings.estimators:
        components = ProbeComponents(model, settings.probe_config(estimator, 1.0))
        dots = []
        for i in range(E["sequences"].shape[0]):
            buffer, _ = components.accumulate_sum_X({k: v[i : i + 1] for k, v in E.items()}, 1)
            dots.append(ProbeComponents.dot_param_buffers({n: buffer[n].double() for n in step}, step))
        values = torch.tensor(dots, dtype=torch.float64)
        out[f"deltaH1/{estimator}"] = float(values.mean())
        out[f"deltaH1_se/{estimator}"] = float(values.std() / math.sqrt(len(values)))
    return out


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
