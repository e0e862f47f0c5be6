# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``grpo_valid`` / ``rloo_valid``: verl's GRPO / RLOO over each group's completed rows.

Real: verl 0.7.1's ``core_algos`` estimators (the controls, and what ours call), its registry and
``ray_trainer.compute_advantage`` dispatch on a ``DataProto``. Expected values are hand-computed literals.
"""

from __future__ import annotations

import importlib
from math import comb

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos, ray_trainer

from treetune_verl.ppo import advantage
from treetune_verl.ppo.advantage import compute_grpo_valid_advantage, compute_rloo_valid_advantage

RESPONSE_LENGTH = 3


def _batch(scores: list[float], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome rewards on each row's last response token; length 0 is an aborted row (all-zero mask, score 0).

    Returns ``token_level_rewards`` and ``response_mask``, both [batch, RESPONSE_LENGTH].
    """
    mask = torch.zeros(len(scores), RESPONSE_LENGTH, dtype=torch.int64)
    rewards = torch.zeros(len(scores), RESPONSE_LENGTH)
    for row, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        mask[row, :length] = 1
        if length:
            rewards[row, length - 1] = score
    return rewards, mask


def _row_values(advantages: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """One advantage per row (the value on its response tokens), after checking it is 0 off the mask."""
    assert torch.all(advantages[mask == 0] == 0)
    return [float(advantages[row, 0]) for row in range(advantages.shape[0])]


# One group of 4: scores 1, 1, 0 and one aborted row (the note's worked example).
WORKED_REWARDS, WORKED_MASK = _batch([1.0, 1.0, 0.0, 0.0], [3, 2, 1, 0])
WORKED_UID = np.array(["a"] * 4, dtype=object)


def test_grpo_valid_takes_the_group_statistics_over_completed_rows_only():
    ours, returns = compute_grpo_valid_advantage(WORKED_REWARDS, WORKED_MASK, WORKED_UID)
    assert ours is returns
    # completed [1, 1, 0]: mean 2/3, unbiased std sqrt(1/3) = 0.57735
    assert _row_values(ours, WORKED_MASK) == pytest.approx([0.57735, 0.57735, -1.1547, 0.0], abs=1e-4)
    # verl's grpo counts the aborted row's score 0: mean 1/2, std sqrt(1/3)
    verl, _ = core_algos.compute_grpo_outcome_advantage(WORKED_REWARDS, WORKED_MASK, WORKED_UID)
    assert _row_values(verl, WORKED_MASK) == pytest.approx([0.866, 0.866, -0.866, 0.0], abs=1e-3)


def test_rloo_valid_leaves_each_row_out_of_its_completed_group():
    rewards, mask = _batch([1.0, 0.0, 1.0, 0.0], [2, 3, 1, 0])
    ours, _ = compute_rloo_valid_advantage(rewards, mask, WORKED_UID)
    # score minus the mean of the other two completed rows
    assert _row_values(ours, mask) == pytest.approx([0.5, -1.0, 0.5, 0.0], abs=1e-6)
    verl, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, WORKED_UID)
    assert _row_values(verl, mask) == pytest.approx([2 / 3, -2 / 3, 2 / 3, 0.0], abs=1e-6)  # baseline 1/3, 2/3


def test_groups_with_none_one_or_all_rows_completed():
    # group a: 0 completed; b: 1 completed + 2 aborted; c: all 3 completed; d: 1 row, completed (rollout.n == 1)
    uid = np.array(["a", "a", "b", "b", "b", "c", "c", "c", "d"], dtype=object)
    rewards, mask = _batch([0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.7], [0, 0, 2, 0, 0, 3, 1, 2, 2])
    for ours_fn, verl_fn in [
        (compute_grpo_valid_advantage, core_algos.compute_grpo_outcome_advantage),
        (compute_rloo_valid_advantage, core_algos.compute_rloo_outcome_advantage),
    ]:
        ours, _ = ours_fn(rewards, mask, uid)
        assert torch.all(ours[:5] == 0)  # a (no completed row) and b (one completed row: no baseline)
        verl, _ = verl_fn(rewards, mask, uid)
        assert torch.equal(ours[5:], verl[5:])  # c and d: groups without an aborted row are verl's, bit for bit
    grpo, _ = compute_grpo_valid_advantage(rewards, mask, uid)
    # c: scores [1, 0, 0], mean 1/3, std sqrt(1/3); d: verl's size-1 group keeps the raw score (mean 0, std 1)
    assert _row_values(grpo, mask)[5:] == pytest.approx([1.1547, -0.57735, -0.57735, 0.7], abs=1e-4)


def _random_batch(seed: int, aborted: bool):
    gen = torch.Generator().manual_seed(seed)
    sizes = [4, 4, 3, 1, 5, 2]
    uid = np.array([f"g{g}" for g, size in enumerate(sizes) for _ in range(size)], dtype=object)
    batch, length = len(uid), 7
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    if aborted:
        lengths[torch.rand(batch, generator=gen) < 0.3] = 0
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.int64)
    rewards = torch.zeros(batch, length)
    scores = torch.randint(0, 3, (batch,), generator=gen).float() / 2
    rows = lengths > 0
    rewards[rows, lengths[rows] - 1] = scores[rows]
    return rewards, mask, uid


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("config", [None, {"norm_adv_by_std_in_grpo": False}, "omegaconf", "algo_config"])
def test_without_aborted_rows_grpo_valid_is_verls_grpo_exactly(seed, config):
    norm = True
    if config == "omegaconf":
        config, norm = OmegaConf.create({"norm_adv_by_std_in_grpo": False}), False
    elif config == "algo_config":
        config = AlgoConfig(norm_adv_by_std_in_grpo=True)
    elif config is not None:
        norm = False
    rewards, mask, uid = _random_batch(seed, aborted=False)
    ours, _ = compute_grpo_valid_advantage(rewards, mask, uid, config=config)
    verl, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=norm)
    assert torch.equal(ours, verl)
    ours, _ = compute_rloo_valid_advantage(rewards, mask, uid, config=config)
    verl, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, uid)
    assert torch.equal(ours, verl)


def test_norm_adv_by_std_false_is_the_mean_centred_score():
    config = {"norm_adv_by_std_in_grpo": False}
    ours, _ = compute_grpo_valid_advantage(WORKED_REWARDS, WORKED_MASK, WORKED_UID, config=config)
    assert _row_values(ours, WORKED_MASK) == pytest.approx([1 / 3, 1 / 3, -2 / 3, 0.0], abs=1e-6)


def test_with_aborted_rows_complete_groups_stay_verls():
    rewards, mask, uid = _random_batch(5, aborted=True)
    ours, _ = compute_grpo_valid_advantage(rewards, mask, uid)
    verl, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid)
    completed = mask.sum(-1) > 0
    assert not completed.all() and completed.any()
    for group in set(uid.tolist()):
        rows = torch.from_numpy(uid == group)
        if completed[rows].all():
            assert torch.equal(ours[rows], verl[rows])
        elif completed[rows].sum() < 2:
            assert torch.all(ours[rows] == 0)
    assert torch.all(ours[~completed] == 0)


def test_nothing_completed_gives_zeros():
    rewards, mask = _batch([0.0, 0.0], [0, 0])
    ours, _ = compute_grpo_valid_advantage(rewards, mask, np.array(["a", "b"], dtype=object))
    assert torch.equal(ours, torch.zeros(2, RESPONSE_LENGTH))


@pytest.mark.parametrize("estimator", ["grpo_valid", "rloo_valid"])
def test_verls_compute_advantage_dispatches_to_ours(estimator):
    data = DataProto.from_dict(
        tensors={"token_level_rewards": WORKED_REWARDS.clone(), "response_mask": WORKED_MASK.clone()},
        non_tensors={"uid": WORKED_UID.copy()},
    )
    # verl passes the algorithm config to a registered estimator, not its norm_adv_by_std_in_grpo argument
    out = ray_trainer.compute_advantage(data, adv_estimator=estimator, config=AlgoConfig(adv_estimator=estimator))
    expected = {"grpo_valid": [0.57735, 0.57735, -1.1547, 0.0], "rloo_valid": [0.5, 0.5, -1.0, 0.0]}[estimator]
    assert _row_values(out.batch["advantages"], WORKED_MASK) == pytest.approx(expected, abs=1e-4)
    assert torch.equal(out.batch["returns"], out.batch["advantages"])
    off = OmegaConf.create({"norm_adv_by_std_in_grpo": False})
    if estimator == "grpo_valid":
        out = ray_trainer.compute_advantage(data, adv_estimator=estimator, config=off)
        assert _row_values(out.batch["advantages"], WORKED_MASK) == pytest.approx([1 / 3, 1 / 3, -2 / 3, 0], abs=1e-6)


def test_registration_survives_a_reimport_and_refuses_a_foreign_function():
    module = importlib.reload(advantage)
    assert core_algos.get_adv_estimator_fn("grpo_valid") is module.compute_grpo_valid_advantage
    assert core_algos.get_adv_estimator_fn("rloo_valid") is module.compute_rloo_valid_advantage
    with pytest.raises(ValueError, match="already been registered"):
        core_algos.register_adv_est("grpo_valid")(lambda **kwargs: None)


# E[mean |A| over a group's completed rows] for binary rewards with p = 1/2, exact over all 2^k reward patterns:
# a pattern with m ones (0 < m < k) gives 2 sqrt(m (k - m)) sqrt(k (k - 1)) / k^2 with std normalisation
# (grpo) and 2 m (k - m) / k^2 without it (Dr. GRPO, which averages to (k - 1) / (2k)); m = 0 or k gives 0.
MEAN_ABS_ADVANTAGE = {  # k: (grpo_valid, grpo_valid with norm_adv_by_std_in_grpo=False)
    2: (0.353553, 0.25),
    3: (0.577350, 0.333333),
    4: (0.699760, 0.375),
    5: (0.771329, 0.4),
    6: (0.816286, 0.416667),
    7: (0.846455, 0.428571),
    8: (0.867904, 0.4375),
}


def _enumerated_groups_of_8(k: int):
    """Every binary reward pattern over k completed rows, each as a group of 8 whose other 8 - k rows aborted."""
    patterns = torch.tensor([[(bits >> i) & 1 for i in range(k)] for bits in range(2**k)], dtype=torch.float32)
    scores = torch.zeros(2**k, 8)
    scores[:, :k] = patterns
    lengths = torch.zeros(2**k, 8, dtype=torch.int64)
    lengths[:, :k] = 1
    uid = np.repeat(np.arange(2**k), 8).astype(object)
    rewards, mask = _batch(scores.flatten().tolist(), lengths.flatten().tolist())
    return rewards, mask, uid


def test_mean_abs_advantage_by_completed_group_size():
    """Pins the README figure: what a group shrunk by aborts does to the advantage scale (printed with -s)."""
    print("\ncompleted k of 8 | E mean|A| grpo_valid | norm_adv_by_std=False | P(all equal: no signal)")
    for k, expected in MEAN_ABS_ADVANTAGE.items():
        rewards, mask, uid = _enumerated_groups_of_8(k)
        completed = mask.sum(-1) > 0
        measured = []
        for config in (None, {"norm_adv_by_std_in_grpo": False}):
            adv, _ = compute_grpo_valid_advantage(rewards, mask, uid, config=config)
            measured.append(float(adv[completed, 0].abs().mean()))  # every pattern equally likely at p = 1/2
        print(f"{k:16d} | {measured[0]:19.6f} | {measured[1]:21.6f} | {2 ** (1 - k):.4f}")
        assert measured == pytest.approx(expected, rel=1e-5)
        exact = sum(comb(k, m) / 2**k * 2 * m * (k - m) / k**2 for m in range(1, k))
        assert measured[1] == pytest.approx(exact, rel=1e-6) and exact == pytest.approx((k - 1) / (2 * k))
    rewards, mask, uid = _enumerated_groups_of_8(1)  # one completed row beside 7 aborted: no baseline, no signal
    assert torch.all(compute_grpo_valid_advantage(rewards, mask, uid)[0] == 0)
