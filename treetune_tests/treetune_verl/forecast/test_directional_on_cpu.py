# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast's ⟨X_b, Δθ⟩ from forwards only (``forecast/directional.py``) against independent references.

- Chain rule: given the exact per-token directional derivatives (forward-mode autodiff, ``torch.func.jvp``, with the
  log-softmax and entropy written here), ``x_directional_derivatives`` equals ⟨Σ X, Δθ⟩ from the probe's backward
  passes (``ProbeComponents.accumulate_sum_X``) for every estimator and baseline, per prompt where the baseline is
  stateless and summed over prompts with ``residual_mu``.
- Token values: against the same forward (every row whole, log-softmax written here), with each prompt computed once
  for its G responses and the columns of padding in every row skipped, or whole rows where a group's prompts differ
  or sharing would save fewer prompt tokens than ``MIN_SHARED_PROMPT_TOKENS``.
- Central difference: ``token_values`` at θ ± Δθ against the same forward-mode derivatives, on a tiny Qwen2 (eager
  attention: torch's SDPA kernels have no forward-mode derivative, which is why the forecast differences forwards).
  The error is O(‖Δθ‖³): halving the step divides it by about 8 in absolute terms, 4 relative to the derivative.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, jvp

from treetune_tests.tiny_model import tiny_causal_lm
from treetune_verl.forecast.directional import token_values, x_directional_derivatives
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.teacher_forcing import TeacherForced

VOCAB, R, EOS, PAD = 24, 5, 1, 0
PROMPTS = [[5, 9, 3], [7, 2], [11, 4, 6, 8]]
RESPONSES = [  # G = 3 per prompt, variable lengths (EOS ends a response), budget R
    [[3, 4, 5, 6, 7], [9, EOS], [12, 13, 14]],
    [[2, EOS], [15, 16, 17, 18], [4]],
    [[6, 6, EOS], [21, 22, 23, 2, 3], [8, 10]],
]
ESTIMATORS = {
    "naive": {"estimator": {"x_estimator_mode": "naive"}},
    "rb_none": {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "none"}}},
    "rb_loo": {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "loo"}}},
    "rb_residual_mu": {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "residual_mu"}}},
}
POLICY = {"generation": {"temperature": 0.8, "top_p": 1.0}}


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    model = tiny_causal_lm("qwen2", VOCAB, 16, layers=2, lm_head_std=0.5, pad_token_id=PAD, eos_token_id=EOS)
    model.config._attn_implementation = "eager"  # forward-mode autodiff of the reference
    return model


@pytest.fixture(scope="module")
def E() -> dict[str, torch.Tensor]:
    return make_probe_batch(PROMPTS, RESPONSES, torch.zeros(len(PROMPTS), 3), PAD, [R] * len(PROMPTS))


def _direction(model: torch.nn.Module, scale: float, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=gen) * scale for n, p in model.named_parameters()}


def _exact_tangents(model, E, direction) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lp, H, ⟨∇lp, d⟩, ⟨∇H, d⟩) per response token, ``[B, G, R]`` fp64, by forward-mode autodiff (0 at padding)."""
    B, G, T = E["sequences"].shape
    P = T - R
    ids, mask = E["sequences"].view(B * G, T), E["attention_masks"].view(B * G, T)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    params = {n: p.detach() for n, p in model.named_parameters()}

    def per_token(p):
        logits = functional_call(model, p, (), {"input_ids": ids, "attention_mask": mask, "position_ids": positions})
        log_probs = torch.log_softmax(
            logits.logits[:, P - 1 : T - 1].double() / POLICY["generation"]["temperature"], -1
        )
        lp = log_probs.gather(-1, ids[:, P:, None]).squeeze(-1)
        return lp, -(log_probs.exp() * log_probs).sum(-1)

    (lp, H), (d_lp, d_H) = jvp(per_token, (params,), (direction,))
    valid = mask[:, P:].bool()
    return tuple(t.masked_fill(~valid, 0.0).view(B, G, R) for t in (lp, H, d_lp, d_H))


def _components(model, overrides) -> ProbeComponents:
    return ProbeComponents(model, {**POLICY, **overrides})


@pytest.fixture
def share_any_prompt(monkeypatch):
    """Prompts shared however few tokens that saves (the tiny E saves a dozen, below the default threshold)."""
    from treetune_verl.probe import teacher_forcing

    monkeypatch.setattr(teacher_forcing, "MIN_SHARED_PROMPT_TOKENS", 1)


def _token_values_and_inputs(model, E, mb_size_prompts) -> tuple[TeacherForced, list[tuple[int, int]]]:
    """``token_values`` and the ``input_ids`` shape of each forward it ran."""
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        return token_values(_components(model, ESTIMATORS["rb_none"]), E, mb_size_prompts), shapes
    finally:
        hook.remove()


def test_token_values_are_the_policys_log_probabilities_and_entropies(model, E, share_any_prompt):
    lp, H, _, _ = _exact_tangents(model, E, _direction(model, 1e-3))
    values, inputs = _token_values_and_inputs(model, E, mb_size_prompts=2)
    assert values.token_logprobs.dtype == torch.float64 and values.token_logprobs.shape == (3, 3, R)
    torch.testing.assert_close(values.token_logprobs, lp, atol=2e-6, rtol=0)
    torch.testing.assert_close(values.entropies, H, atol=2e-6, rtol=0)
    # each prompt once (its cache repeated for its G responses), then the responses less their last column; columns
    # of padding in every row skipped: prompts 0, 1 start at column 1 of P = 4 (lengths 3, 2), prompt 2 fills it
    assert inputs == [(2, 3), (6, R - 1), (1, 4), (3, R - 1)]


def test_token_values_skip_padding_columns_and_share_only_a_common_prompt(model, E, monkeypatch):
    from treetune_verl.probe import teacher_forcing

    lp, H, _, _ = _exact_tangents(model, E, _direction(model, 1e-3))
    wide = make_probe_batch(PROMPTS, RESPONSES, torch.zeros(len(PROMPTS), 3), PAD, [R + 3] * len(PROMPTS))
    values, inputs = _token_values_and_inputs(model, wide, mb_size_prompts=3)
    assert inputs == [(9, 4 + R)], "3 x 2 x 4 = 24 prompt tokens saved (< 64): whole rows, the padding columns skipped"
    torch.testing.assert_close(values.token_logprobs[..., :R], lp, atol=2e-6, rtol=0)
    torch.testing.assert_close(values.entropies[..., :R], H, atol=2e-6, rtol=0)
    assert not values.token_logprobs[..., R:].any() and not values.entropies[..., R:].any()

    monkeypatch.setattr(teacher_forcing, "MIN_SHARED_PROMPT_TOKENS", 24)
    values, inputs = _token_values_and_inputs(model, wide, mb_size_prompts=3)
    assert inputs == [(3, 4), (9, R - 1)], "the 3 response columns of padding in every row were computed"
    torch.testing.assert_close(values.token_logprobs[..., :R], lp, atol=2e-6, rtol=0)
    torch.testing.assert_close(values.entropies[..., :R], H, atol=2e-6, rtol=0)
    assert not values.token_logprobs[..., R:].any() and not values.entropies[..., R:].any()

    mixed = {key: value.clone() for key, value in E.items()}
    monkeypatch.setattr(teacher_forcing, "MIN_SHARED_PROMPT_TOKENS", 1)
    mixed["sequences"][1, 2, -R - 1] = 13  # prompt 1's last token, in its third row only
    lp, H, _, _ = _exact_tangents(model, mixed, _direction(model, 1e-3))
    values, inputs = _token_values_and_inputs(model, mixed, mb_size_prompts=1)
    # prompt 1's rows differ: whole rows, its 2 prompt columns and its longest response (4 tokens)
    assert inputs == [(1, 3), (3, R - 1), (3, 2 + 4), (1, 4), (3, R - 1)]
    torch.testing.assert_close(values.token_logprobs, lp, atol=2e-6, rtol=0)
    torch.testing.assert_close(values.entropies, H, atol=2e-6, rtol=0)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_chain_rule_gives_the_probes_x_inner_products(model, E, name):
    direction = _direction(model, 1e-2)
    lp, H, d_lp, d_H = _exact_tangents(model, E, direction)
    mask = E["attention_masks"][:, :, -R:].bool()
    at = TeacherForced(lp, H, mask)
    plus, minus = TeacherForced(lp + d_lp, H + d_H, mask), TeacherForced(lp - d_lp, H - d_H, mask)
    mu_state = {"mu": torch.tensor([3.0, 2.1, 1.2, 0.6, 0.2], dtype=torch.float64), "seen": torch.ones(R, dtype=bool)}
    mu_state |= {"updates": 2, "decay": 0.9}

    forecast_comps = _components(model, ESTIMATORS[name])
    forecast_comps.baseline.load_state_dict(mu_state)
    dots = x_directional_derivatives({name: forecast_comps}, E, at, plus, minus)[name]  # [B]

    reference_comps = _components(model, ESTIMATORS[name])
    reference_comps.baseline.load_state_dict(mu_state)
    if name == "rb_residual_mu":  # μ is read once per batch: compare the batch sum
        buffer, _ = reference_comps.accumulate_sum_X(E, 1)
        expected = torch.tensor([ProbeComponents.dot_param_buffers(buffer, direction)], dtype=torch.float64)
        dots = dots.sum(0, keepdim=True)
        assert forecast_comps.baseline.updates == reference_comps.baseline.updates == 3  # E folded into μ once
        torch.testing.assert_close(forecast_comps.baseline.mu, reference_comps.baseline.mu)
    else:
        expected = []
        for b in range(len(PROMPTS)):
            buffer, _ = reference_comps.accumulate_sum_X({k: v[b : b + 1] for k, v in E.items()}, 1)
            expected.append(ProbeComponents.dot_param_buffers(buffer, direction))
        expected = torch.tensor(expected, dtype=torch.float64)
    assert expected.abs().min() > 1e-4  # not a comparison of zeros
    torch.testing.assert_close(dots, expected, rtol=1e-5, atol=1e-9)


def _central_difference_error(model, E, scale) -> tuple[float, float]:
    """(max |central difference − exact| over tokens, max |exact|) for ⟨∇lp, d⟩ and ⟨∇H, d⟩ along d of ``scale``."""
    direction = _direction(model, scale, seed=1)
    _, _, d_lp, d_H = _exact_tangents(model, E, direction)
    comps = _components(model, ESTIMATORS["rb_none"])
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    values = {}
    with torch.no_grad():
        for sign in (1, -1):
            for n, p in model.named_parameters():
                p.copy_(theta[n] + sign * direction[n])
            values[sign] = token_values(comps, E, 3)
        for n, p in model.named_parameters():
            p.copy_(theta[n])
    central = torch.cat(
        [
            (values[1].token_logprobs - values[-1].token_logprobs) / 2,
            (values[1].entropies - values[-1].entropies) / 2,
        ]
    )
    exact = torch.cat([d_lp, d_H])
    return float((central - exact).abs().max()), float(exact.abs().max())


def test_central_difference_along_the_step_is_second_order(model, E):
    # a random direction over every parameter: the largest token derivative is 0.15 nats at 5e-4 per element
    error_big, size_big = _central_difference_error(model, E, 5e-4)
    error_half, size_half = _central_difference_error(model, E, 2.5e-4)
    assert size_big == pytest.approx(2 * size_half, rel=1e-6)  # the exact derivative is linear in the step
    assert error_big / size_big < 1e-2 and error_half / size_half < 2.5e-3  # measured 5.8e-3 and 1.5e-3
    ratio = error_big / error_half
    print(f"relative error {error_big / size_big:.2e} -> {error_half / size_half:.2e}, ratio {ratio:.2f}")
    assert 6.0 < ratio < 10.0  # O(step³): 8 for a halved step, the float32 rounding of the forwards aside


def _fsdp2_model(param_dtype: torch.dtype | None, tmp_path) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = tiny_causal_lm("qwen2", VOCAB, 16, pad_token_id=PAD, eos_token_id=EOS)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


def test_below_float32_the_method_is_backward(tmp_path):
    """Central differences of a small step in bf16 measure rounding flips (SmolLM2, AdamW lr 1e-6: 10-30x off per
    prompt, spec): ``auto`` takes backward passes there, and ``central_difference`` is refused."""
    import torch.distributed as dist

    from treetune_verl.forecast.directional import compute_dtype
    from treetune_verl.forecast.live import use_backward

    plain = tiny_causal_lm("qwen2", VOCAB, 16, pad_token_id=PAD, eos_token_id=EOS)
    assert compute_dtype(plain) == torch.float32 and not use_backward("auto", plain)
    assert use_backward("backward", plain) and not use_backward("central_difference", plain)
    assert use_backward("auto", plain.to(torch.bfloat16))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mixed, full = _fsdp2_model(torch.bfloat16, tmp_path), _fsdp2_model(None, tmp_path)
        assert compute_dtype(mixed) == torch.bfloat16 and use_backward("auto", mixed)
        assert compute_dtype(full) == torch.float32 and not use_backward("auto", full)
        with pytest.raises(ValueError, match="method=central_difference.*bfloat16"):
            use_backward("central_difference", mixed)
    finally:
        dist.destroy_process_group()
