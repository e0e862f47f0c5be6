# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``run_mixed_probe``'s contract: its return keys, its pieces, and the precomputed P Ȳ / ground truth the main job
passes in (one Y per U batch and one real step across E batches and estimators)."""

from __future__ import annotations

import pytest
import torch

from treetune_tests.treetune_verl.probe.tiny import PROMPTS, sample_batch, tiny_llama, token_count_reward_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.ground_truth import true_entropy_change, truth_of_batch
from treetune_verl.probe.mixed_probe import estimate_mean_Y, run_mixed_probe

T = 3  # fixed response length: L_max = T for every prompt
RESULT_KEYS = {
    "bars_dot",
    "deltaH1",
    "B_E",
    "B_U",
    "lr",
    "x_estimator_mode",
    "baseline_mode",
    "weighting_mode",
    "rb_normalize_by_length",
    "target_units",
    "norm_X",
    "norm_Y",
    "preconditioner",
    "optimizer",
    "params_without_state",
    "params",
    "step_norm",
    "timing",
}
TRUTH_RESULT_KEYS = {"deltaH_true", "H_before", "H_after", "min_ess"}


def _batches(model: torch.nn.Module) -> tuple[dict, dict, dict]:
    gen = torch.Generator().manual_seed(0)
    E1, E2 = (sample_batch(model, PROMPTS, 4, T, gen) for _ in range(2))
    return E1, E2, token_count_reward_batch(model, PROMPTS, 4, T, gen)


def _adam_with_state(model: torch.nn.Module) -> torch.optim.Adam:
    """Adam whose second moments are populated (so P is not the identity); the weights move by one small step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.0, 0.999))
    sum(p.pow(2).sum() for p in model.parameters()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return optimizer


@pytest.mark.parametrize("ground_truth", [True, False])
def test_return_keys_are_the_documented_ones(ground_truth):
    model = tiny_llama()
    E, _, U = _batches(model)
    result = run_mixed_probe(model, E, U, {"ground_truth": {"enable": ground_truth}})
    assert set(result) == RESULT_KEYS | (TRUTH_RESULT_KEYS if ground_truth else set())
    phases = {"X_s", "Y_s", "dot_s", "total_s"} | ({"ground_truth_s", "train_step_s"} if ground_truth else set())
    assert set(result["timing"]) == phases


@pytest.mark.parametrize("estimator", ["naive", "rb_residual"])
def test_precomputed_mean_Y_and_ground_truth_reproduce_the_plain_call(estimator):
    """The main job's path (P Ȳ once, one step measured on two E batches) gives each E the plain call's numbers."""
    config = {"estimator": {"x_estimator_mode": estimator}, "ground_truth": {"enable": True}}
    model = tiny_llama()
    E1, E2, U = _batches(model)
    optimizer = _adam_with_state(model)
    plain_components = ProbeComponents(model, config, optimizer)
    plain = [run_mixed_probe(model, E, U, config, optimizer, plain_components) for E in (E1, E2)]

    components = ProbeComponents(model, config, optimizer)
    mean_Y = estimate_mean_Y(components, U, 2, optimizer)
    truth = true_entropy_change(components, [E1, E2], U, 2, optimizer, 1e-3)
    shared = [
        run_mixed_probe(
            model, E, U, config, optimizer, components, mean_Y=mean_Y, ground_truth=truth_of_batch(truth, i)
        )
        for i, E in enumerate((E1, E2))
    ]
    for a, b in zip(plain, shared, strict=True):
        assert a["preconditioner"] == "optimizer" and a["params_without_state"] == 0
        assert {k: v for k, v in a.items() if k != "timing"} == {k: v for k, v in b.items() if k != "timing"}
        assert set(b["timing"]) == {"X_s", "dot_s", "total_s"}  # no Y pass, no step of its own


def test_deltaH_true_is_taken_in_the_estimators_target_units():
    """RB without length normalisation targets nats per sequence: with every response of length T that is T times
    the per-L_max-token value the naive estimator reports for the same step and E."""
    model = tiny_llama()
    E, _, U = _batches(model)
    naive = run_mixed_probe(model, E, U, {"estimator": {"x_estimator_mode": "naive"}})
    rb_config = {"estimator": {"x_estimator_mode": "rb_residual", "rb_normalize_by_length": False}}
    rb = run_mixed_probe(model, E, U, rb_config)
    assert naive["target_units"] == "nats per L_max token" and rb["target_units"] == "nats per sequence"
    assert naive["deltaH_true"] != 0.0
    assert rb["deltaH_true"] == pytest.approx(T * naive["deltaH_true"], rel=1e-9)
    assert rb["H_before"] == naive["H_before"]  # H_before/H_after stay per L_max token
