# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``control/sensitivity.py`` (the controller's ``b`` and entropy step) against references written here.

A tiny Qwen2 (eager attention: forward-mode autodiff), E of 4 prompts × 3 responses of variable length, a real AdamW
warmed by three steps and then the update's step θ -> θ′ through ``WeightsAroundStep``, as the forecast takes it.
References, by ``torch.func`` on a forward with the log-softmax and entropy written here:
- ``∇H_A``: the gradient of half A's (even prompts') mean token entropy at θ′, by ``torch.func.grad``;
- ``b``: the exact directional derivative (``jvp``) of half B's (odd prompts') pooled token entropy along
  ``k ⊙ ∇H_A`` (``k``: ``adam_sensitivity``, tested against torch's own step in its own test), and its delta-method
  standard error over B's responses from the per-response jvps;
- the weights left: θ′ bit for bit after ``restore``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call, grad, jvp

from treetune_tests.tiny_model import tiny_causal_lm
from treetune_verl.control.adam_sensitivity import step_sensitivity
from treetune_verl.control.sensitivity import measure, split_halves
from treetune_verl.forecast.step_weights import WeightsAroundStep
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.components import ProbeComponents

VOCAB, R, EOS, PAD, TEMPERATURE = 24, 5, 1, 0, 0.8
PROMPTS = [[5, 9, 3], [7, 2], [11, 4, 6, 8], [13, 3]]
RESPONSES = [
    [[3, 4, 5, 6, 7], [9, EOS], [12, 13, 14]],
    [[2, EOS], [15, 16, 17, 18], [4]],
    [[6, 6, EOS], [21, 22, 23, 2, 3], [8, 10]],
    [[19, 20, 5], [7, EOS], [3, 3, 3, 3, 3]],
]


def _token_entropies(model, params, E) -> tuple[torch.Tensor, torch.Tensor]:
    """Per response token: entropy of the tempered softmax at its state (fp64) and the response mask, ``[N, R]``."""
    B, G, T = E["sequences"].shape
    P = T - R
    ids, mask = E["sequences"].view(B * G, T), E["attention_masks"].view(B * G, T)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = functional_call(model, params, (), {"input_ids": ids, "attention_mask": mask, "position_ids": positions})
    log_probs = torch.log_softmax(logits.logits[:, P - 1 : T - 1].double() / TEMPERATURE, -1)
    valid = mask[:, P:].double()
    return -(log_probs.exp() * log_probs).sum(-1) * valid, valid


def _warmed_update():
    torch.manual_seed(0)
    model = tiny_causal_lm("qwen2", VOCAB, 16, layers=2, lm_head_std=0.5, pad_token_id=PAD, eos_token_id=EOS)
    model.config._attn_implementation = "eager"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids = torch.tensor([[5, 9, 3, 4, 5, 6, 7, 8]])

    def loss_step():
        optimizer.zero_grad()
        logits = model(input_ids=ids).logits[0, :-1]
        torch.nn.functional.cross_entropy(logits, ids[0, 1:]).backward()
        optimizer.step()

    for _ in range(3):
        loss_step()
    return model, optimizer, loss_step


def test_b_is_the_exact_derivative_along_the_entropy_step_and_the_weights_come_back():
    model, optimizer, loss_step = _warmed_update()
    E = make_probe_batch(PROMPTS, RESPONSES, torch.zeros(len(PROMPTS), 3), PAD, [R] * len(PROMPTS))
    components = ProbeComponents(model, {"generation": {"temperature": TEMPERATURE, "top_p": 1.0}})
    weights = WeightsAroundStep(components)
    loss_step()  # the update's first optimizer step: θ -> θ′
    theta_prime = {n: p.detach().clone() for n, p in model.named_parameters()}
    k = step_sensitivity(optimizer)
    step_norm = math.sqrt(weights.swap())
    sensitivity = measure(components, E, 2, k, weights, step_norm)
    weights.restore()

    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), theta_prime[n]), f"{n} not back at θ′"

    half_a, half_b = split_halves(E)
    assert half_a["sequences"].tolist() == E["sequences"][[0, 2]].tolist()
    params = {n: p.detach() for n, p in model.named_parameters()}

    def mean_entropy_a(p):
        h, valid = _token_entropies(model, p, half_a)
        return h.sum() / valid.sum()

    grad_a = grad(mean_entropy_a)(params)
    name_of = {p: n for n, p in model.named_parameters()}
    expected_step = {name_of[p]: (kp * grad_a[name_of[p]].double()) for p, kp in k.items()}
    # float32 forwards on both sides: within 1e-4 of the largest element (an element's own relative error is not
    # defined where the gradient is rounding noise, e.g. the key biases, to which the softmax is invariant)
    scale = max(want.abs().max().item() for want in expected_step.values())
    error = max((sensitivity.entropy_step[n] - want).abs().max().item() for n, want in expected_step.items())
    assert error <= 1e-4 * scale, f"entropy step off by {error:.3g} (largest element {scale:.3g})"

    direction = {n: expected_step[n].float() for n in params}

    def per_response_b(p):
        h, valid = _token_entropies(model, p, half_b)
        return h.sum(-1), valid.sum(-1)

    (sums, counts), (tangent, _) = jvp(per_response_b, (params,), (direction,))
    b_ref = float(tangent.sum() / counts.sum())
    n = len(tangent)
    residual = tangent - b_ref * counts
    se_ref = math.sqrt(float(residual.square().sum()) / (n * (n - 1))) / float(counts.mean())
    assert abs(b_ref) > 1e-3, f"the test's step moves nothing: b = {b_ref:.3g}"
    assert sensitivity.b == pytest.approx(b_ref, rel=1e-2), (sensitivity.b, b_ref)
    assert sensitivity.b_se == pytest.approx(se_ref, rel=2e-2), (sensitivity.b_se, se_ref)
    # ascending half A's entropy raises half B's here (one objective, a positive-definite preconditioner)
    assert sensitivity.b > 0


def test_the_split_needs_two_prompts_on_each_rank():
    E = make_probe_batch(PROMPTS[:1], RESPONSES[:1], torch.zeros(1, 3), PAD, [R])
    with pytest.raises(ValueError, match="at least 2 prompts"):
        split_halves(E)
