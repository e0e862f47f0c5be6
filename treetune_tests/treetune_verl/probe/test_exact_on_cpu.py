# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Exact checks on a tiny Llama whose whole response space (5**3 responses per prompt) is enumerable.

Reference values come from ``tiny.py``: enumeration over every response, autograd for ∇H, fp64. The probe runs the
fp32 model through its normal path (sampler, padded batch, teacher forcing, surrogate losses, backward()).
"""

from __future__ import annotations

import copy

import pytest
import torch

from treetune_tests.treetune_verl.probe.tiny import (
    PAD,
    PROMPTS,
    all_responses,
    exact_sequence_logprobs,
    exact_target_and_grad,
    flat_buffer,
    flat_params,
    optimizer_in_state,
    sample_batch,
    tiny_llama,
    token_count_reward_batch,
)
from treetune_verl.probe.batch import make_probe_batch, validate_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.mixed_probe import estimate_mean_Y, run_mixed_probe
from treetune_verl.probe.sampling import sample_responses
from treetune_verl.probe.teacher_forcing import teacher_force

T = 3  # fixed response length (no EOS), so L_max = T and the target is ∇H/T

POLICIES = [(1.0, 1.0), (0.7, 0.8), (1.3, 0.9)]


def _policy_cfg(temperature: float, top_p: float) -> dict:
    return {"generation": {"temperature": temperature, "top_p": top_p}}


@pytest.mark.parametrize(("temperature", "top_p"), POLICIES)
def test_teacher_forcing_matches_enumerated_policy(temperature, top_p):
    model = tiny_llama()
    responses = all_responses(T)
    ref = copy.deepcopy(model).double()
    for prompt in PROMPTS:
        with torch.no_grad():
            seq_lp, ent = exact_sequence_logprobs(ref, prompt, responses, temperature, top_p)
        # Probabilities over the whole response space sum to 1 (the policy is renormalised after top-p).
        support = torch.isfinite(seq_lp)
        torch.testing.assert_close(
            seq_lp[support].exp().sum(), torch.tensor(1.0, dtype=torch.float64), rtol=0, atol=1e-9
        )
        # A batch of every response in the support, with 2 extra columns of left padding (must not matter).
        inside = responses[support]
        N = inside.shape[0]
        batch = make_probe_batch([prompt], [inside.tolist()], torch.zeros(1, N), PAD)
        batch["sequences"] = torch.nn.functional.pad(batch["sequences"], (2, 0), value=PAD)
        batch["attention_masks"] = torch.nn.functional.pad(batch["attention_masks"], (2, 0), value=0)
        _, _, response_col = validate_probe_batch(batch)
        assert response_col == len(prompt) + 2
        with torch.no_grad():
            tf = teacher_force(model, batch, response_col, temperature, top_p, with_entropy=True)
        assert tf.token_logprobs.shape == (1, N, T)
        torch.testing.assert_close(tf.entropies[0].double(), ent[support], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tf.token_logprobs[0].double().sum(-1), seq_lp[support], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("temperature", "top_p"), POLICIES[1:])
def test_sampler_draws_from_the_teacher_forced_policy(temperature, top_p):
    model = tiny_llama()
    gen = torch.Generator().manual_seed(11)
    n = 6000
    prompt = PROMPTS[0]
    responses, sampled_lp = sample_responses(model, [prompt], n, temperature, top_p, T, PAD, (), gen, batch_size=8192)
    batch = make_probe_batch([prompt], responses, torch.zeros(1, n), PAD)
    with torch.no_grad():
        tf = teacher_force(model, batch, validate_probe_batch(batch)[2], temperature, top_p, False)
    # The log-probs recorded while sampling equal the teacher-forced ones (same policy, same positions).
    torch.testing.assert_close(tf.token_logprobs[0], torch.tensor(sampled_lp[0]), rtol=1e-5, atol=1e-5)
    # Empirical frequencies match the exact sequence distribution: total variation within sampling noise.
    with torch.no_grad():
        exact_lp, _ = exact_sequence_logprobs(
            copy.deepcopy(model).double(), prompt, all_responses(T), temperature, top_p
        )
    exact = exact_lp.exp().nan_to_num(0.0)
    codes = torch.tensor([r[0] * 25 + r[1] * 5 + r[2] for r in responses[0]])
    empirical = torch.bincount(codes, minlength=125).double() / n
    assert empirical[exact == 0].sum() == 0  # nothing sampled outside the nucleus
    tv = 0.5 * (empirical - exact).abs().sum()
    expected_tv = 0.5 * (exact * (1 - exact) / n).sqrt().sum() * (2 / torch.pi) ** 0.5  # E|freq - p| summed
    assert tv < 1.5 * expected_tv, (float(tv), float(expected_tv))


def _x_estimates(model, configs: dict[str, dict], n_batches: int, G: int, temperature: float, top_p: float):
    gen = torch.Generator().manual_seed(1)
    components = {k: ProbeComponents(model, {**c, **_policy_cfg(temperature, top_p)}) for k, c in configs.items()}
    estimates: dict[str, list[torch.Tensor]] = {k: [] for k in configs}
    for _ in range(n_batches):
        E = sample_batch(model, PROMPTS, G, T, gen, temperature, top_p)
        for name, comps in components.items():
            buf, B = comps.accumulate_sum_X(E, mb_size_prompts=len(PROMPTS))
            estimates[name].append(flat_buffer(model, buf) / B)
    return {k: torch.stack(v) for k, v in estimates.items()}


NAIVE = {"estimator": {"x_estimator_mode": "naive"}}
RB_NONE = {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "none"}}}
RB_MU = {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "residual_mu"}}}


@pytest.mark.parametrize(
    ("temperature", "top_p", "configs"),
    [
        (1.0, 1.0, {"naive": NAIVE, "rb_none": RB_NONE, "rb_mu": RB_MU}),
        (0.7, 0.8, {"naive": NAIVE, "rb_mu": RB_MU}),
    ],
    ids=["tau1-p1-all", "tau0.7-p0.8"],
)
def test_x_estimators_are_unbiased_for_the_exact_entropy_gradient(temperature, top_p, configs):
    model = tiny_llama()
    _, exact_grad = exact_target_and_grad(model, PROMPTS, T, temperature, top_p)
    X = _x_estimates(model, configs, n_batches=200, G=16, temperature=temperature, top_p=top_p)
    spread = {}
    for name, samples in X.items():
        mean = samples.mean(dim=0)
        assert mean.shape == exact_grad.shape
        cosine = torch.nn.functional.cosine_similarity(mean, exact_grad, dim=0)
        norm_ratio = mean.norm() / exact_grad.norm()
        assert cosine > 0.99, (name, float(cosine))
        assert abs(norm_ratio - 1) < 0.05, (name, float(norm_ratio))
        spread[name] = float(samples.var(dim=0).sum())  # total per-batch variance over parameters
    assert spread["rb_mu"] < spread["naive"], spread
    if "rb_none" in spread:
        assert spread["rb_none"] < spread["naive"], spread


def test_weighting_modes_and_rb_normalisation_agree_at_fixed_length():
    model = tiny_llama()
    E = sample_batch(model, PROMPTS, 6, T, torch.Generator().manual_seed(5))
    dr, _ = ProbeComponents(model, {**NAIVE, "probe": {"weighting_mode": "dr_grpo"}}).accumulate_sum_X(E, 3)
    pta, _ = ProbeComponents(model, {**NAIVE, "probe": {"weighting_mode": "per_token_avg"}}).accumulate_sum_X(E, 3)
    for name in dr:
        torch.testing.assert_close(dr[name], pta[name], rtol=1e-6, atol=1e-9)
    norm_cfg = {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "none"}}}
    raw_cfg = {
        "estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "none"}, "rb_normalize_by_length": False}
    }
    normed, _ = ProbeComponents(model, norm_cfg).accumulate_sum_X(E, 3)
    raw, _ = ProbeComponents(model, raw_cfg).accumulate_sum_X(E, 3)
    for name in normed:
        torch.testing.assert_close(raw[name], T * normed[name], rtol=1e-5, atol=1e-6)


def _independent_step(model, optimizer, U) -> torch.nn.Module:
    """θ′ from the test's own objective: -J with J = mean_b mean_g (A/T)·log π(y) from unpadded forwards."""
    stepped = copy.deepcopy(model)
    opt = type(optimizer)(stepped.parameters())  # load_state_dict sets the user's group settings and state
    opt.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    P = U["sequences"].shape[-1] - T
    J = 0.0
    for b, prompt in enumerate(PROMPTS):
        seq_lp, _ = exact_sequence_logprobs(stepped, prompt, U["sequences"][b, :, P:], 1.0, 1.0)
        J = J + (U["advantages"][b].double() / T * seq_lp).mean()
    opt.zero_grad()
    (-(J / len(PROMPTS))).backward()
    opt.step()
    return stepped


@pytest.mark.parametrize(
    "optimizer_name", ["sgd", "adam", "adam_fresh", "adam_t1", "adam_t5", "adamw_wd", "sgd_momentum"]
)
def test_deltaH1_and_ground_truth_match_the_exact_entropy_change(optimizer_name):
    model = tiny_llama()
    gen = torch.Generator().manual_seed(3)
    optimizer = optimizer_in_state(optimizer_name, model, gen, T)
    lr = optimizer.defaults["lr"]
    U = token_count_reward_batch(model, PROMPTS, 8, T, gen)
    H_before, exact_grad = exact_target_and_grad(model, PROMPTS, T)
    stepped = _independent_step(model, optimizer, U)
    H_after, _ = exact_target_and_grad(stepped, PROMPTS, T)
    exact_delta = H_after - H_before
    step = flat_params(stepped) - flat_params(model)
    first_order = float(exact_grad @ step)
    assert exact_delta != 0
    assert abs(first_order / exact_delta - 1) < 0.05, (first_order, exact_delta)

    E = sample_batch(model, PROMPTS, 6000, T, gen)
    params_before = flat_params(model)
    state_before = copy.deepcopy(optimizer.state_dict())
    config = {**RB_MU, **_policy_cfg(1.0, 1.0), "probe": {"mb_size_prompts": 3}, "ground_truth": {"enable": True}}
    result = run_mixed_probe(model, E, U, config, optimizer)
    assert result["preconditioner"] == "optimizer" and result["optimizer"] == type(optimizer).__name__
    fresh = optimizer_name in ("sgd", "adam_fresh")  # plain SGD keeps no state; a fresh Adam has none yet
    assert result["params_without_state"] == (result["params"] if fresh else 0)
    assert result["lr"] == lr
    assert result["deltaH_true"] * exact_delta > 0
    assert abs(result["deltaH_true"] / exact_delta - 1) < 0.05, (result["deltaH_true"], exact_delta)
    # ΔH₁ is a stochastic estimate (B_E·G = 18000 sequences here); its exactness is the unbiasedness test's job.
    assert abs(result["deltaH1"] / exact_delta - 1) < 0.15, (result["deltaH1"], exact_delta)
    print(
        f"{optimizer_name}: exact {exact_delta:.4e}, first-order {first_order:.4e}, deltaH1 {result['deltaH1']:.4e}, "
        f"deltaH_true {result['deltaH_true']:.4e}, step norm {result['step_norm']:.3e}"
    )
    if optimizer_name == "adam_fresh":  # negative control: lr·Ȳ (the old identity fallback) is far off
        identity = run_mixed_probe(
            model, E, U, {**config, "probe": {"mb_size_prompts": 3, "preconditioner": "identity"}}, optimizer
        )
        assert abs(identity["deltaH1"] / exact_delta - 1) > 0.5, (identity["deltaH1"], exact_delta)
        print(f"adam_fresh with probe.preconditioner=identity: deltaH1 {identity['deltaH1']:.4e}")
    # Δθ is the optimizer's own step (taken in float64); the test's independent step is float32: they agree to
    # float32's resolution of θ' - θ.
    comps = ProbeComponents(model, _policy_cfg(1.0, 1.0))
    predicted_step = lr * flat_buffer(model, estimate_mean_Y(comps, U, 3, optimizer).buffer)
    assert torch.nn.functional.cosine_similarity(predicted_step, step, dim=0) > 0.99999
    assert abs(float(predicted_step.norm() / step.norm()) - 1) < 1e-3
    assert result["step_norm"] == pytest.approx(float(predicted_step.norm()), rel=1e-6)
    # The probe restored the weights and the optimizer state exactly.
    assert torch.equal(flat_params(model), params_before)
    _assert_state_equal(optimizer.state_dict(), state_before)


def _assert_state_equal(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        assert a["state"][k].keys() == b["state"][k].keys()
        for key, value in a["state"][k].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["state"][k][key])), (k, key)
