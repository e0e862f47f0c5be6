# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Exact expectations, not Monte Carlo: every G-tuple of responses, weighted by its probability Π_g π(y_g).

The tiny policy has an EOS token and a fixed per-prompt budget (L_max = T), so responses have variable lengths
(1 .. T); all 21 of them per prompt are enumerated (``tiny.responses_with_eos``). The probe's estimators run through
their normal path (padded batch, teacher forcing, surrogate loss, ``backward()``) on each tuple; the reference values
(∇H, the entropy before and after a real step) come from ``tiny.py``'s unpadded fp64 forwards, independent of the
probe. An estimator is unbiased iff its probability-weighted sum over all tuples equals the reference.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from treetune_tests.treetune_verl.probe.tiny import (
    PAD,
    PROMPTS,
    exact_variable_length_logprobs,
    exact_variable_length_target,
    flat_buffer,
    flat_params,
    optimizer_in_state,
    responses_with_eos,
    sample_batch,
    tiny_llama,
)
from treetune_verl.probe.advantages import group_advantages
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.ground_truth import importance_weighted_entropies
from treetune_verl.probe.mixed_probe import estimate_mean_Y

V, EOS, T = 5, 4, 2  # responses end at EOS or at the budget T: 1 + 4 + 16 = 21 per prompt
G_X = 2  # the naive estimator's leave-one-out baseline needs G >= 2; 21**2 tuples per prompt
POLICY = {"generation": {"temperature": 1.0, "top_p": 1.0}}
NAIVE = {"estimator": {"x_estimator_mode": "naive"}}
NAIVE_PER_TOKEN_AVG = {**NAIVE, "probe": {"weighting_mode": "per_token_avg"}}
RB_NONE = {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "none"}}}
RB_MU = {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "residual_mu"}}}
RB_LOO = {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "loo"}}}
# A fixed μ from "previous batches" (any value that does not depend on the current sample keeps RB unbiased).
MU_STATE = {
    "mu": torch.tensor([0.9, 0.35], dtype=torch.float64),
    "seen": torch.ones(2, dtype=torch.bool),
    "updates": 3,
    "decay": 0.9,
}


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_llama(seed=1).double()  # fp64: a small step survives rounding of θ′ = θ + Δθ


@pytest.fixture(scope="module")
def responses() -> list[list[int]]:
    return responses_with_eos(T, V, EOS)


def _probabilities(model: torch.nn.Module, prompt: list[int], responses: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        seq_lp, _ = exact_variable_length_logprobs(model, prompt, responses)
    return seq_lp.exp()


def _exact_gradient(model: torch.nn.Module, responses: list[list[int]]) -> torch.Tensor:
    ref = copy.deepcopy(model)  # its .grad must not land on the module-scoped model
    exact_variable_length_target(ref, PROMPTS, responses, T).backward()
    return torch.cat([p.grad.reshape(-1) for p in ref.parameters() if p.requires_grad])


def _exact_expectation_of_X(model, responses, config: dict) -> torch.Tensor:
    """Σ over prompts and G_X-tuples of Π π(y_g) · X(tuple), divided by the prompt count: E[X̄] exactly."""
    comps = ProbeComponents(model, {**config, **POLICY})
    total = torch.zeros_like(flat_params(model))
    for prompt in PROMPTS:
        probs = _probabilities(model, prompt, responses)
        for tup in itertools.product(range(len(responses)), repeat=G_X):
            comps.baseline.load_state_dict(MU_STATE)  # μ fixed: it comes from earlier batches, not this one
            batch = make_probe_batch([prompt], [[responses[i] for i in tup]], torch.zeros(1, G_X), PAD, [T])
            buf, B = comps.accumulate_sum_X(batch, mb_size_prompts=1)
            total += float(torch.prod(probs[list(tup)])) * flat_buffer(model, buf) / B
    return total / len(PROMPTS)


@pytest.fixture(scope="module")
def exact_X(model, responses) -> dict[str, torch.Tensor]:
    configs = {
        "naive": NAIVE,
        "rb_none": RB_NONE,
        "rb_mu": RB_MU,
        "rb_loo": RB_LOO,
        "naive_per_token_avg": NAIVE_PER_TOKEN_AVG,
    }
    return {name: _exact_expectation_of_X(model, responses, cfg) for name, cfg in configs.items()}


def test_enumeration_covers_the_whole_response_space(model, responses):
    assert len(responses) == 21 and len({tuple(r) for r in responses}) == 21
    for prompt in PROMPTS:
        total = float(_probabilities(model, prompt, responses).sum())
        assert abs(total - 1.0) < 1e-12, total
    assert {len(r) for r in responses} == {1, 2}  # variable lengths under the fixed budget


@pytest.mark.parametrize("name", ["naive", "rb_none", "rb_mu", "rb_loo"])
def test_both_x_estimators_are_exactly_unbiased_with_eos_and_variable_lengths(exact_X, model, responses, name):
    exact = _exact_gradient(model, responses)
    expectation = exact_X[name]
    cosine = float(torch.nn.functional.cosine_similarity(expectation, exact, dim=0))
    ratio = float(expectation.norm() / exact.norm())
    print(f"{name}: cosine {cosine:.9f}, norm ratio {ratio:.7f}")
    assert cosine > 1 - 1e-9, cosine
    assert abs(ratio - 1) < 1e-5, ratio


def test_negative_control_per_token_average_weighting_is_biased_with_variable_lengths(exact_X, model, responses):
    """S/L with a random L is not the gradient of H_seq/L_max (documented in ``estimators.py``): visibly off."""
    exact = _exact_gradient(model, responses)
    off = float((exact_X["naive_per_token_avg"] - exact).norm() / exact.norm())
    assert off > 1e-2, off


def _independent_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, U: dict) -> torch.nn.Module:
    """θ′ by the test's own objective -J, J = mean_b mean_g (A/L_max)·log π(y), unpadded fp32 forwards."""
    stepped = copy.deepcopy(model)
    opt = type(optimizer)(stepped.parameters())
    opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    P = U["sequences"].shape[-1] - T
    J = 0.0
    for b, prompt in enumerate(PROMPTS):
        rows = [
            [int(t) for t, m in zip(seq[P:], mask[P:], strict=True) if m]
            for seq, mask in zip(U["sequences"][b], U["attention_masks"][b], strict=True)
        ]
        seq_lp, _ = exact_variable_length_logprobs(stepped, prompt, rows)
        J = J + (U["advantages"][b].double() / T * seq_lp).mean()
    opt.zero_grad()
    (-(J / len(PROMPTS))).backward()
    opt.step()
    return stepped


def _count_reward_batch(model: torch.nn.Module, gen: torch.Generator) -> dict:
    U = sample_batch(model, PROMPTS, 8, T, gen, eos_token_ids=(EOS,), max_lengths=[T] * len(PROMPTS))
    P = U["sequences"].shape[-1] - T
    reward = ((U["sequences"][..., P:] == 2) & U["attention_masks"][..., P:].bool()).sum(-1).double()
    U["advantages"] = group_advantages(reward, "grpo").float()
    return U


@pytest.mark.parametrize(
    "optimizer_name", ["sgd", "adam_fresh", "adam_t1", "adam_t5", "adam", "adamw_wd", "sgd_momentum"]
)
def test_expected_deltaH1_of_both_estimators_matches_the_exact_change_after_a_real_step(
    exact_X, model, responses, optimizer_name
):
    """E[ΔH₁] = ⟨E[X̄], Δθ⟩ (ΔH₁ is linear in X̄) against H(θ′) − H(θ) after the optimizer's real step.

    ``adam`` is Adam at step 10⁴ (bias correction invisible); ``adam_fresh`` has no state (first step lr·g/(|g|+eps)).
    """
    gen = torch.Generator().manual_seed(5)
    model = copy.deepcopy(model)  # the optimizer warm-up must not touch the module-scoped model
    optimizer = optimizer_in_state(optimizer_name, model, gen, T)
    # A small step, where the first order is the change (the second order grows as lr²); SGD's raw gradient step is
    # the larger one here. Adam's is kept at lr/10: much smaller, its elementwise g/(|g|+eps) meets eps.
    shrink = 0.01 if optimizer_name.startswith("sgd") else 0.1
    for group in optimizer.param_groups:
        group["lr"] *= shrink
    U = _count_reward_batch(model, gen)
    comps = ProbeComponents(model, POLICY)
    lr = optimizer.param_groups[0]["lr"]
    step = lr * flat_buffer(model, estimate_mean_Y(comps, U, 3, optimizer).buffer)

    with torch.no_grad():
        before = float(exact_variable_length_target(model, PROMPTS, responses, T))
    stepped = _independent_step(model, optimizer, U)
    with torch.no_grad():
        after = float(exact_variable_length_target(stepped, PROMPTS, responses, T))
    exact_change = after - before
    real_step = flat_params(stepped) - flat_params(model)
    assert torch.nn.functional.cosine_similarity(step, real_step, dim=0) > 0.9999  # Δθ is the real step
    for name in ("naive", "rb_mu"):
        expected_deltaH1 = float(exact_X[name] @ step)
        print(f"{optimizer_name} {name}: E[deltaH1] {expected_deltaH1:.5e}, exact change {exact_change:.5e}")
        assert abs(expected_deltaH1 / exact_change - 1) < 0.05, (name, expected_deltaH1, exact_change)


# ---- ground truth: the importance-weighted entropy after the step, exactly unbiased at small G ----


def _stats(model: torch.nn.Module, prompt: list[int], responses) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return exact_variable_length_logprobs(model, prompt, responses)


def _self_normalised(S0, F0, S1, F1):
    """The estimator this module replaced (negative control): softmax_g(S1 - S0) weights."""
    return F0.mean(dim=1), (torch.softmax(S1 - S0, dim=1) * F1).sum(dim=1), None


def _expected_change(estimator, G: int, S0, F0, S1, F1) -> float:
    """Exact E over y_1..y_G ~ π_θ of the estimator's h_after - h_before, for one prompt."""
    tuples = torch.tensor(list(itertools.product(range(S0.numel()), repeat=G)))  # [N**G, G]
    h0, h1, _ = estimator(S0[tuples], F0[tuples], S1[tuples], F1[tuples])
    weights = S0[tuples].sum(dim=1).exp()  # Π_g π_θ(y_g)
    return float((weights * (h1 - h0)).sum())


@pytest.mark.parametrize("G", [1, 2, 4])
def test_ground_truth_estimator_is_exactly_unbiased_at_small_G(model, responses, G):
    gen = torch.Generator().manual_seed(7)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)  # a large step: the weights are far from 1
    stepped = _independent_step(model, optimizer, _count_reward_batch(model, gen))
    for prompt in PROMPTS:
        S0, F0 = _stats(model, prompt, responses)
        S1, F1 = _stats(stepped, prompt, responses)
        exact = float((S1.exp() * F1).sum() - (S0.exp() * F0).sum())
        estimated = _expected_change(importance_weighted_entropies, G, S0, F0, S1, F1)
        assert abs(exact) > 1e-3
        assert abs(estimated - exact) < 1e-9 * max(1.0, abs(exact)), (G, estimated, exact)
        if G <= 2:  # negative control: self-normalised weights miss part of the change at small G (all at G = 1)
            snis = _expected_change(_self_normalised, G, S0, F0, S1, F1)
            print(f"G={G}: exact {exact:.6f}, unbiased {estimated:.6f}, self-normalised {snis:.6f}")
            assert abs(snis / exact - 1) > 1e-4, (snis, exact)  # the unbiased one is exact to 1e-9


def test_top_p_a_token_outside_the_nucleus_after_the_step_weighs_zero(model, responses):
    """With top_p < 1, a response whose token is outside θ′'s nucleus has π_θ′ = 0: weight 0, not an error."""
    from treetune_verl.probe.teacher_forcing import teacher_force

    top_p = 0.5
    batch = make_probe_batch([PROMPTS[0]], [responses], torch.zeros(1, len(responses)), PAD, [T])
    P = batch["sequences"].shape[-1] - T
    with pytest.raises(ValueError, match="outside the top-p nucleus"):
        teacher_force(model, batch, P, 1.0, top_p, True)
    with torch.no_grad():
        tf = teacher_force(model, batch, P, 1.0, top_p, True, allow_zero_probability=True)
    S_after = tf.token_logprobs.sum(-1)  # [1, N]
    outside = torch.isneginf(S_after)
    assert outside.any() and not outside.all()
    assert torch.isfinite(tf.entropies).all()
    S_before = torch.zeros_like(S_after)  # any finite value: only the weights of the outside rows matter here
    F = tf.entropies.sum(-1)
    _, h_after, ess = importance_weighted_entropies(S_before, F, S_after, F)
    assert torch.isfinite(h_after).all() and torch.isfinite(ess).all()
    assert float(ess) < outside.numel() - int(outside.sum()) + 1e-9  # the outside rows carry no weight
