# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Microbatch invariance: prompt-microbatches of 1, 2 and all give the same X/Y buffers (relative 1e-5).

Responses end at an EOS token here, so lengths vary within and across prompts (padding and L_max both matter).
"""

from __future__ import annotations

import pytest
import torch

from treetune_tests.treetune_verl.probe.tiny import PROMPTS, sample_batch, tiny_llama
from treetune_verl.probe.advantages import group_advantages
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.mixed_probe import estimate_mean_Y

EOS = 4
PROMPTS4 = [*PROMPTS, [3, 3, 1, 0, 2]]
MB_SIZES = (1, 2, len(PROMPTS4))


def _batches(model):
    gen = torch.Generator().manual_seed(7)
    warm = sample_batch(model, PROMPTS4, 3, 5, gen, 0.9, 0.95, eos_token_ids=(EOS,))
    E = sample_batch(model, PROMPTS4, 3, 5, gen, 0.9, 0.95, eos_token_ids=(EOS,))
    lengths = E["attention_masks"][..., -5:].sum(-1)
    assert lengths.unique().numel() > 1  # the test needs variable lengths
    return warm, E


def _assert_buffers_close(a, b):
    assert a.keys() == b.keys()
    for name in a:
        scale = a[name].abs().max().clamp(min=1e-12)
        torch.testing.assert_close(a[name] / scale, b[name] / scale, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("estimator", "weighting_mode"),
    [
        ({"x_estimator_mode": "naive"}, "dr_grpo"),
        ({"x_estimator_mode": "naive"}, "per_token_avg"),
        ({"x_estimator_mode": "rb_residual", "baseline": {"mode": "none"}}, "dr_grpo"),
        ({"x_estimator_mode": "rb_residual", "baseline": {"mode": "residual_mu"}}, "dr_grpo"),
        ({"x_estimator_mode": "rb_residual", "baseline": {"mode": "loo"}}, "dr_grpo"),
        (
            {"x_estimator_mode": "rb_residual", "baseline": {"mode": "residual_mu"}, "rb_normalize_by_length": False},
            "dr_grpo",
        ),
    ],
    ids=["naive_dr_grpo", "naive_per_token_avg", "rb_none", "rb_mu", "rb_loo", "rb_mu_unnormalised"],
)
def test_x_buffers_do_not_depend_on_the_microbatch_size(estimator, weighting_mode):
    model = tiny_llama()
    warm, E = _batches(model)
    config = {"estimator": estimator, "probe": {"weighting_mode": weighting_mode}, **_policy()}
    buffers, mus = [], []
    for mb in MB_SIZES:
        comps = ProbeComponents(model, config)
        comps.accumulate_sum_X(warm, 2)  # the same μ history for every microbatch size
        buf, n_prompts = comps.accumulate_sum_X(E, mb)
        assert n_prompts == len(PROMPTS4)
        buffers.append(buf)
        mus.append(comps.baseline.vector(5))
    for buf, mu in zip(buffers[1:], mus[1:], strict=True):
        _assert_buffers_close(buffers[0], buf)
        torch.testing.assert_close(mu, mus[0], rtol=1e-6, atol=1e-7)
    if estimator.get("baseline", {}).get("mode") == "residual_mu":
        assert mus[0].abs().sum() > 0


def _policy():
    return {"generation": {"temperature": 0.9, "top_p": 0.95}}


def test_y_buffers_do_not_depend_on_the_microbatch_size():
    model = tiny_llama()
    _, U = _batches(model)
    U["advantages"] = group_advantages(torch.rand(len(PROMPTS4), 3, generator=torch.Generator().manual_seed(1)), "grpo")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.0, 0.99))
    for p in model.parameters():
        optimizer.state[p] = {
            "step": torch.tensor(5.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.rand_like(p),
        }
    buffers = []
    for mb in MB_SIZES:
        comps = ProbeComponents(model, _policy(), optimizer)
        mean_Y = estimate_mean_Y(comps, U, mb, optimizer)  # Ȳ over microbatches, then Adam's step from it
        assert len(PROMPTS4) == mean_Y.B_U
        buffers.append(mean_Y.buffer)
    for buf in buffers[1:]:
        _assert_buffers_close(buffers[0], buf)
    assert sum(float(t.abs().sum()) for t in buffers[0].values()) > 0


def test_probe_passes_leave_grads_and_mode_untouched():
    model = tiny_llama()
    model.train()
    _, E = _batches(model)
    sentinel = {n: torch.full_like(p, 3.0) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = sentinel[n].clone()
    ProbeComponents(model, _policy()).accumulate_sum_X(E, 2)
    assert model.training
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, sentinel[n])


def test_warming_the_baseline_folds_in_what_accumulate_sum_x_would():
    """``warm_baseline`` = the μ update of ``accumulate_sum_X`` on the same batch, without X (no gradient left)."""
    model = tiny_llama()
    warm, E = _batches(model)
    config = {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "residual_mu"}}, **_policy()}
    by_x, by_warm = ProbeComponents(model, config), ProbeComponents(model, config)
    by_x.accumulate_sum_X(warm, 2)
    assert by_warm.warm_baseline(warm, 1)  # another microbatch size: μ does not depend on it
    assert all(p.grad is None for p in model.parameters())
    assert by_warm.baseline.updates == by_x.baseline.updates == 1
    torch.testing.assert_close(by_warm.baseline.vector(5), by_x.baseline.vector(5), rtol=1e-6, atol=1e-7)
    assert by_warm.baseline.vector(5).abs().sum() > 0
    # the X that follows is the one of a warmed accumulate_sum_X
    _assert_buffers_close(by_x.accumulate_sum_X(E, 2)[0], by_warm.accumulate_sum_X(E, 2)[0])
    for estimator in ({"x_estimator_mode": "naive"}, {"x_estimator_mode": "rb_residual", "baseline": {"mode": "loo"}}):
        assert not ProbeComponents(model, {"estimator": estimator, **_policy()}).warm_baseline(warm, 2)
