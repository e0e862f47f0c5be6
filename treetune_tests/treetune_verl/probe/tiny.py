# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Tiny causal LMs and exact (enumerated) reference quantities for the probe tests.

The reference code is deliberately independent of ``treetune_verl.probe``: unpadded forwards with the model's default
positions, top-p by an explicit per-row loop, fp64 throughout, entropy as -Σ_y π(y) log π(y) over every response.

Shape notation:
    V = vocabulary, T = fixed response length, N = V**T enumerated responses, n_params = trainable parameter count
"""

from __future__ import annotations

import itertools

import torch
from transformers import LlamaForCausalLM

from treetune_tests.tiny_model import tiny_causal_lm
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.sampling import sample_responses

VOCAB = 5
PROMPTS = [[1, 2, 3], [4], [2, 0]]  # different lengths: exercises left padding
PAD = 0  # also a real token; padding is never attended to nor scored


def tiny_llama(seed: int = 0, vocab: int = VOCAB, hidden: int = 8, init_std: float = 0.6) -> LlamaForCausalLM:
    """1-layer fp32 Llama; a large init std makes the policy far from uniform (entropy varies with context)."""
    return tiny_causal_lm(
        "llama",
        vocab,
        hidden,
        max_positions=64,
        init_std=init_std,
        seed=seed,
        pad_token_id=PAD,
        bos_token_id=None,
        eos_token_id=None,
    )


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters() if p.requires_grad])


def flat_buffer(model: torch.nn.Module, buf: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([buf[n].reshape(-1).double() for n, p in model.named_parameters() if p.requires_grad])


def reference_policy_log_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """``[..., V]`` -> ``[..., V]`` fp64 log-probs of the tempered top-p policy, row by row."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.full_like(flat, float("-inf"))
    for i in range(flat.shape[0]):
        row = flat[i]
        order = sorted(range(row.numel()), key=lambda v: -float(row[v]))
        kept, mass = [], 0.0
        for v in order:
            if mass >= top_p and top_p < 1.0:
                break
            kept.append(v)
            mass += float(row[v])
        z = row[kept].sum()
        out[i, kept] = torch.log(row[kept] / z)
    return out.reshape(probs.shape)


def all_responses(T: int, vocab: int = VOCAB) -> torch.Tensor:
    """``[V**T, T]`` every response of length T."""
    return torch.tensor(list(itertools.product(range(vocab), repeat=T)), dtype=torch.long)


def exact_sequence_logprobs(
    model: torch.nn.Module, prompt: list[int], responses: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log π(y) [N], per-token entropies [N, T])`` fp64, differentiable, from one unpadded forward."""
    N, T = responses.shape
    ids = torch.cat([torch.tensor(prompt).expand(N, -1), responses], dim=1)
    logits = model(input_ids=ids).logits[:, len(prompt) - 1 : len(prompt) - 1 + T]  # [N, T, V]
    if top_p < 1.0:
        # Masks from the reference loop (no grad through the support), values from a differentiable renorm.
        with torch.no_grad():
            keep = torch.isfinite(reference_policy_log_probs(logits, temperature, top_p))
        log_probs = torch.log_softmax((logits.double() / temperature).masked_fill(~keep, float("-inf")), dim=-1)
    else:
        keep = torch.ones_like(logits, dtype=torch.bool)
        log_probs = torch.log_softmax(logits.double() / temperature, dim=-1)
    token_lp = log_probs.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    ent = -(log_probs.exp() * log_probs.masked_fill(~keep, 0.0)).sum(-1)
    return token_lp.sum(-1), ent


def exact_target(
    model: torch.nn.Module, prompts: list[list[int]], T: int, temperature: float = 1.0, top_p: float = 1.0
) -> torch.Tensor:
    """mean_b H_seq(x_b) / T, H_seq = -Σ_y π(y|x) log π(y|x) over all V**T responses (fp64 scalar, differentiable).

    Responses outside the support (probability 0 under top-p) contribute 0.
    """
    responses = all_responses(T, model.config.vocab_size)
    total = 0.0
    for prompt in prompts:
        seq_lp, _ = exact_sequence_logprobs(model, prompt, responses, temperature, top_p)
        finite = torch.isfinite(seq_lp)
        lp = seq_lp[finite]
        total = total + (-(lp.exp() * lp).sum()) / T
    return total / len(prompts)


def exact_target_and_grad(
    model: torch.nn.Module, prompts: list[list[int]], T: int, temperature: float = 1.0, top_p: float = 1.0
) -> tuple[float, torch.Tensor]:
    """``(value, flat gradient [n_params])`` of ``exact_target`` on an fp64 copy of ``model``."""
    import copy

    ref = copy.deepcopy(model).double()
    ref.zero_grad(set_to_none=True)
    value = exact_target(ref, prompts, T, temperature, top_p)
    value.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in ref.parameters() if p.requires_grad])
    return float(value.detach()), grad


def sample_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    G: int,
    T: int,
    generator: torch.Generator,
    temperature: float = 1.0,
    top_p: float = 1.0,
    advantages: torch.Tensor | None = None,
    eos_token_ids: tuple[int, ...] = (),
    max_lengths: list[int] | None = None,
) -> dict[str, torch.Tensor]:
    """A probe batch sampled with the probe's sampler (fixed length T unless ``eos_token_ids``)."""
    responses, _ = sample_responses(
        model, prompts, G, temperature, top_p, T, PAD, eos_token_ids, generator, batch_size=4096
    )
    adv = advantages if advantages is not None else torch.zeros(len(prompts), G)
    return make_probe_batch(prompts, responses, adv, PAD, max_lengths)


def token_count_reward_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    G: int,
    T: int,
    generator: torch.Generator,
    token: int = 2,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> dict[str, torch.Tensor]:
    """A U batch whose reward is the count of ``token`` in the response; GRPO advantages."""
    from treetune_verl.probe.advantages import group_advantages

    responses, _ = sample_responses(model, prompts, G, temperature, top_p, T, PAD, (), generator, batch_size=4096)
    rewards = torch.tensor([[float(sum(t == token for t in r)) for r in group] for group in responses])
    return make_probe_batch(prompts, responses, group_advantages(rewards, "grpo"), PAD)


def responses_with_eos(T: int, vocab: int, eos: int) -> list[list[int]]:
    """Every response under a budget of T tokens: ends at its first ``eos`` (kept), or runs to T tokens without one.

    Count: Σ_{k=1..T} (V-1)**(k-1) responses ending in EOS, plus (V-1)**T that reach the budget.
    """
    others = [v for v in range(vocab) if v != eos]
    out: list[list[int]] = []
    for k in range(1, T + 1):
        out += [list(prefix) + [eos] for prefix in itertools.product(others, repeat=k - 1)]
    out += [list(r) for r in itertools.product(others, repeat=T)]
    return out


def exact_variable_length_logprobs(
    model: torch.nn.Module, prompt: list[int], responses: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log π(y) [N], Σ_k H_k along y [N])`` fp64 (temperature 1, no top-p), one unpadded forward per length.

    Differentiable in the model's parameters; no padding anywhere (responses are grouped by length).
    """
    seq_lp = [None] * len(responses)
    ent_sum = [None] * len(responses)
    for length in sorted({len(r) for r in responses}):
        idx = [i for i, r in enumerate(responses) if len(r) == length]
        resp = torch.tensor([responses[i] for i in idx], dtype=torch.long)
        ids = torch.cat([torch.tensor(prompt).expand(len(idx), -1), resp], dim=1)
        logits = model(input_ids=ids).logits[:, len(prompt) - 1 : len(prompt) - 1 + length]
        log_probs = torch.log_softmax(logits.double(), dim=-1)  # [n, length, V]
        lp = log_probs.gather(-1, resp.unsqueeze(-1)).squeeze(-1).sum(-1)
        ent = -(log_probs.exp() * log_probs).sum(-1).sum(-1)
        for j, i in enumerate(idx):
            seq_lp[i], ent_sum[i] = lp[j], ent[j]
    return torch.stack(seq_lp), torch.stack(ent_sum)


def exact_variable_length_target(
    model: torch.nn.Module, prompts: list[list[int]], responses: list[list[int]], max_length: int
) -> torch.Tensor:
    """mean_b H_seq(x_b) / L_max over the enumerated variable-length responses (fp64, differentiable)."""
    total = 0.0
    for prompt in prompts:
        seq_lp, _ = exact_variable_length_logprobs(model, prompt, responses)
        total = total + (-(seq_lp.exp() * seq_lp).sum()) / max_length
    return total / len(prompts)


def _populated_adam(model: torch.nn.Module, gen: torch.Generator, T: int) -> torch.optim.Adam:
    """Adam(β1 = 0) whose second moments come from the gradients of 4 other U batches, at a saturated step count."""
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=2e-4, betas=(0.0, 0.999))
    comps = ProbeComponents(model, {"generation": {"temperature": 1.0, "top_p": 1.0}})
    sq = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for _ in range(4):
        buf, B = comps.accumulate_sum_Y(token_count_reward_batch(model, PROMPTS, 8, T, gen), 3)
        for n in sq:
            sq[n] += (buf[n] / B) ** 2 / 4
    for n, p in model.named_parameters():
        step = 10000.0
        optimizer.state[p] = {
            "step": torch.tensor(step),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": sq[n] * (1 - 0.999**step),
        }
    return optimizer


def optimizer_in_state(name: str, model: torch.nn.Module, gen: torch.Generator, T: int) -> torch.optim.Optimizer:
    """The optimizer families of the probe issue, each at a state where its step differs from plain SGD.

    States come from real steps on other U batches (token-count reward, fixed length T), weights put back.
    """
    params = list(model.parameters())
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "adam":  # populated second moments at a saturated step count (bias correction invisible)
        return _populated_adam(model, gen, T)
    if name == "adam_fresh":  # no state: the first step is lr * g / (|g| + eps) elementwise, not lr * g
        return torch.optim.Adam(params, lr=2e-5)
    warm = {
        "adam_t1": (torch.optim.Adam, {"lr": 2e-5}, 1),
        "adam_t5": (torch.optim.Adam, {"lr": 2e-5}, 5),
        "adamw_wd": (torch.optim.AdamW, {"lr": 2e-5, "weight_decay": 0.1}, 3),
        "sgd_momentum": (torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}, 3),
    }
    cls, kwargs, steps = warm[name]
    optimizer = cls(params, **kwargs)
    for _ in range(steps):  # real steps on other U batches, weights put back: a state as after that many updates
        saved = [p.detach().clone() for p in params]
        comps = ProbeComponents(model, {"generation": {"temperature": 1.0, "top_p": 1.0}})
        buf, B = comps.accumulate_sum_Y(token_count_reward_batch(model, PROMPTS, 8, T, gen), 3)
        for n, p in model.named_parameters():
            p.grad = (-buf[n] / B).to(p.dtype)
        optimizer.step()
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
                p.grad = None
    return optimizer
