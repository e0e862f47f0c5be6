# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast tests' independent reference, from plain HF forwards with log-softmax, per-token entropies and every
estimator written out here (no product code): ⟨X_b, Δθ⟩ of the probe's estimators and the tangent of E's token
entropy by autograd at θ; the realised change of E's token entropy at its states and the importance-weighted
realised change of its sequence entropy; and E's probe batches read back as token lists."""

from __future__ import annotations

import copy
import math

import torch

from treetune_verl.probe.batch import make_probe_batch


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, copied (a collective under FSDP2: every rank calls it)."""
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for name, p in model.named_parameters()
    }


def _token_values(model: torch.nn.Module, prompt: list[int], response: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per response token, (log π(y_k | s_k), H(π(·|s_k))) ``[L]`` float64 from one HF forward at T = 1 (with the
    model's graph when grad is enabled)."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()  # the positions predicting y
    log_p = torch.log_softmax(logits, dim=-1)
    return log_p.gather(-1, torch.tensor(response)[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)


def _surrogates(model: torch.nn.Module, prompt: list[int], group: list[list[int]], budget: int) -> dict:
    """The X surrogates of one prompt, written from their definitions (``probe/estimators.py``'s docstring) with the
    settings the forecast tests use: L_max = ``budget``, the naive estimator's dr_grpo weighting S / L_max with a
    leave-one-out baseline, Rao-Blackwellised with b_j = H_j (baseline ``none``), normalised by L_max; and the summed
    token entropy Σ_k H_k of each response g at E's states (key ``("token", g)``)."""
    values = [_token_values(model, prompt, y) for y in group]
    G = len(group)
    S = torch.stack([lp.sum() for lp, _ in values])
    weighted = S.detach() / budget
    loo = (weighted.sum() - weighted) / (G - 1)
    naive = -((weighted - loo) * S).mean()
    rb = []
    for lp, h in values:
        later = h.detach().flip(0).cumsum(0).flip(0) - h.detach()  # Σ_{k>j} H_k
        rb.append((later * lp).sum() + h.sum())
    out = {"naive": naive, "rb_residual": torch.stack(rb).mean() / budget}
    return out | {("token", g): h.sum() for g, (_, h) in enumerate(values)}


def directional_reference(
    model: torch.nn.Module, E: dict[str, torch.Tensor], step: dict[str, torch.Tensor], budget: int
) -> dict[str, float]:
    """Per prompt b of E, ⟨X_b, Δθ⟩ by autograd of the surrogates on ``model`` at θ (T = 1; ``step`` = Δθ by parameter
    name, float64): per estimator the mean ``deltaH1/<e>`` and its standard error ``deltaH1_se/<e>``; and
    ``token_tangent`` ``[B][G]``, ⟨∇ Σ_k H_k, Δθ⟩ of each response at E's states."""
    names = [n for n, p in model.named_parameters() if p.requires_grad and n in step]
    params = [p for n, p in model.named_parameters() if p.requires_grad and n in step]
    dots: dict = {"naive": [], "rb_residual": [], "token": []}
    prompts, responses = token_lists([E])
    for prompt, group in zip(prompts, responses, strict=True):
        dots["token"].append([])
        for key, loss in _surrogates(model.train(), prompt, group, budget).items():
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            dot = sum(float((g.double() * step[n]).sum()) for n, g in zip(names, grads, strict=True) if g is not None)
            (dots["token"][-1] if isinstance(key, tuple) else dots[key]).append(dot)
    out = {}
    for estimator in ("naive", "rb_residual"):
        values = torch.tensor(dots[estimator], dtype=torch.float64)
        out[f"deltaH1/{estimator}"] = float(values.mean())
        out[f"deltaH1_se/{estimator}"] = float(values.std() / math.sqrt(len(values)))
    out["token_tangent"] = dots["token"]
    return out


def softmax_reference(
    before: torch.nn.Module, after: torch.nn.Module, E: dict[str, torch.Tensor], step: dict[str, torch.Tensor]
) -> dict[str, float]:
    """The forecast exact in the softmax, per token H(softmax(ℓ_θ + ⟨∇ℓ, Δθ⟩)) − H(softmax(ℓ_θ)), pooled per token
    over E's responses: ``deltaH_softmax(_se)`` and ``softmax_error_se`` (of realised − it, paired). The logits'
    tangent ⟨∇ℓ, Δθ⟩ = J Δθ exactly, by reverse mode twice (J Δθ = ∂/∂u ⟨Jᵀu, Δθ⟩) on a float64 copy with eager
    attention (a finite difference there meets the float32 that HF's RMSNorm computes in); the realised change from
    HF forwards at θ′ (``after``)."""
    model = copy.deepcopy(before).double().eval()
    model.config._attn_implementation = "eager"  # double backward through attention
    names = [n for n, p in model.named_parameters() if n in step]
    params = [p for n, p in model.named_parameters() if n in step]

    def entropy(logits: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(logits, dim=-1)
        return -(log_p.exp() * log_p).sum(-1)

    prompts, responses = token_lists([E])
    tokens, change, realised = [], [], []
    for prompt, group in zip(prompts, responses, strict=True):
        for y in group:
            logits = model(input_ids=torch.tensor([prompt + y])).logits[0, len(prompt) - 1 : -1]
            u = torch.zeros_like(logits, requires_grad=True)
            grads = torch.autograd.grad(logits, params, grad_outputs=u, create_graph=True, allow_unused=True)
            along = sum((g * step[n]).sum() for n, g in zip(names, grads, strict=True) if g is not None)
            ell, ell_dot = logits.detach(), torch.autograd.grad(along, u)[0]
            h0 = entropy(ell).sum()
            tokens.append(float(len(y)))
            change.append(float(entropy(ell + ell_dot).sum() - h0))
            realised.append(float(_token_values(after.eval(), prompt, y)[1].double().sum() - h0))
    out = {}
    out["deltaH_softmax"], out["deltaH_softmax_se"] = pooled_ratio(change, tokens)
    out["softmax_error_se"] = pooled_ratio([r - c for r, c in zip(realised, change, strict=True)], tokens)[1]
    return out


def pooled_ratio(numerators: list[float], counts: list[float]) -> tuple[float, float]:
    """Σx / Σc over units and its delta-method standard error, sqrt(Σ(x − r c)² / (n (n − 1))) / mean(c)."""
    x, c = torch.tensor(numerators, dtype=torch.float64), torch.tensor(counts, dtype=torch.float64)
    r, n = float(x.sum() / c.sum()), len(x)
    return r, math.sqrt(float(((x - r * c) ** 2).sum()) / (n * (n - 1))) / float(c.mean())


@torch.no_grad()
def token_entropy_reference(
    before: torch.nn.Module,
    after: torch.nn.Module,
    E: dict[str, torch.Tensor],
    tangent: list[list[float]],
    units: list[list[tuple[int, int]]] | None = None,
) -> dict[str, float]:
    """E's token entropy before, its change at E's states after the step, and the forecast ``tangent`` (per response,
    from :func:`directional_reference`), pooled per token with standard errors over ``units`` (lists of (prompt,
    response) pairs summed into one unit; default: each response its own), and ``error_se``, the standard error of the
    paired difference realised − forecast."""
    prompts, responses = token_lists([E])
    tokens, h0, h1 = {}, {}, {}
    for b, (prompt, group) in enumerate(zip(prompts, responses, strict=True)):
        for g, y in enumerate(group):
            tokens[b, g] = float(len(y))
            h0[b, g] = float(_token_values(before.eval(), prompt, y)[1].sum())
            h1[b, g] = float(_token_values(after.eval(), prompt, y)[1].sum())
    units = units or [[key] for key in tokens]

    def summed(values) -> list[float]:
        return [sum(values[key] for key in unit) for unit in units]

    forecast = {(b, g): tangent[b][g] for b, g in tokens}
    change = {key: h1[key] - h0[key] for key in tokens}
    out = {"H_before": pooled_ratio(summed(h0), summed(tokens))[0]}
    out["deltaH1"], out["deltaH1_se"] = pooled_ratio(summed(forecast), summed(tokens))
    out["deltaH_realised"], out["deltaH_realised_se"] = pooled_ratio(summed(change), summed(tokens))
    error = {key: change[key] - forecast[key] for key in tokens}
    out["error_se"] = pooled_ratio(summed(error), summed(tokens))[1]
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


def pooled_token_entropy(model: torch.nn.Module, prompts: list[list[int]], responses: list[list[list[int]]]) -> float:
    """E's token entropy pooled over every response token (nats per token) under ``model``: one HF forward per
    response (:func:`_token_values`, T = 1)."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for prompt, group in zip(prompts, responses, strict=True):
            for response in group:
                _, entropy = _token_values(model.eval(), prompt, response)
                total, tokens = total + float(entropy.sum()), tokens + len(response)
    return total / tokens


def held_out_half(E_batches: list[dict[str, torch.Tensor]]) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The entropy controller's held-out half of E: each rank's odd prompts (``control/sensitivity.split_halves``),
    as ``token_lists`` gives them."""
    prompts, responses = [], []
    for E in E_batches:
        rank_prompts, rank_responses = token_lists([E])
        prompts += rank_prompts[1::2]
        responses += rank_responses[1::2]
    return prompts, responses
