# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every advantage estimator of the installed verl with over-sampling's aborted groups: exact or refused.

Over-sampling keeps whole groups (``agent_loop/over_sample.py``); the rows of an aborted group reach the trainer with
an all-zero ``response_mask`` and score 0. For each estimator in verl's registry, verl's own
``ray_trainer.compute_advantage`` runs on a batch of kept groups plus aborted groups, and again on the kept rows
alone (the run over-sampling stands for: "the values it would give without the aborted rows"). The table
``ESTIMATORS_WITH_ABORTED_GROUPS`` (``treetune_verl/ppo/advantage.py``) must say *exact* exactly for the estimators
whose kept rows come out the same (and whose aborted rows get no advantage), and give a reason for every other
estimator; the start-up check refuses those, and any estimator the table does not know, naming supported ones.

Rows differ in length, score and per-token inputs (seeded), groups are interleaved with aborted ones, so a batch-wide
statistic (a whitening, a count of rows) that takes the aborted rows in shows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos, ray_trainer

from treetune_verl.ppo.advantage import ESTIMATORS_WITH_ABORTED_GROUPS, supported_with_aborted_groups
from treetune_verl.trainer.features import check_over_sample_config

PROMPT_LENGTH, RESPONSE_LENGTH, GROUP = 2, 6, 4
KEPT_GROUPS, ABORTED_GROUPS = ["k0", "k1", "k2"], ["a0", "a1"]
ORDER = ["k0", "a0", "k1", "a1", "k2"]  # groups interleaved in the batch, GROUP rows each (verl's repeat order)
GDPO_KEYS = ["accuracy", "format"]


# Inputs only some estimators read; the trainer has them only in such runs (and passes ``reward_baselines`` to
# every registered estimator when present, which not all accept).
EXTRA_INPUTS = {
    "gae": ("values",),
    "remax": ("reward_baselines",),
    "optimal_token_baseline": ("old_log_probs", "sum_pi_squared"),
    "tir_optimal_token_baseline": ("old_log_probs", "sum_pi_squared"),
}
OPTIONAL = {name for names in EXTRA_INPUTS.values() for name in names}


def _batch(estimator: str, seed: int = 0) -> tuple[DataProto, torch.Tensor]:
    """The over-sampled batch for ``estimator`` and its ``[rows]`` kept-row mask."""
    generator = torch.Generator().manual_seed(seed)
    uids = [group for group in ORDER for _ in range(GROUP)]
    kept = torch.tensor([not uid.startswith("a") for uid in uids])
    rows = len(uids)
    lengths = torch.randint(1, RESPONSE_LENGTH + 1, (rows,), generator=generator)
    lengths[~kept] = 0
    response_mask = (torch.arange(RESPONSE_LENGTH) < lengths[:, None]).to(torch.int64)
    scores = torch.randint(0, 3, (rows,), generator=generator).float() / 2  # 0, 0.5, 1: ties and spread
    scores[~kept] = 0.0
    token_level_rewards = torch.zeros(rows, RESPONSE_LENGTH)
    token_level_rewards[kept, lengths[kept] - 1] = scores[kept]
    attention_mask = torch.cat([torch.ones(rows, PROMPT_LENGTH, dtype=torch.int64), response_mask], dim=1)
    old_log_probs = -torch.rand(rows, RESPONSE_LENGTH, generator=generator) * 3 * response_mask
    sum_pi_squared = torch.rand(rows, RESPONSE_LENGTH, generator=generator) * response_mask
    tensors = {
        "token_level_rewards": token_level_rewards,
        "response_mask": response_mask,
        "attention_mask": attention_mask,
        "prompts": torch.ones(rows, PROMPT_LENGTH, dtype=torch.int64),
        "values": torch.randn(rows, RESPONSE_LENGTH, generator=generator) * response_mask,  # gae's critic
        "reward_baselines": torch.rand(rows, generator=generator) * kept,  # remax's greedy rollouts
        "old_log_probs": old_log_probs,
        "sum_pi_squared": sum_pi_squared,  # the optimal token baselines
    }
    tensors = {k: v for k, v in tensors.items() if k not in OPTIONAL or k in EXTRA_INPUTS.get(estimator, ())}
    non_tensors = {"uid": np.array(uids, dtype=object)}
    for key in GDPO_KEYS:  # gdpo's reward components, 0 on aborted rows like the score
        non_tensors[key] = (torch.randint(0, 2, (rows,), generator=generator).float() * kept).numpy()
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors), kept


def _advantages(data: DataProto, estimator: str) -> torch.Tensor:
    config = AlgoConfig(adv_estimator=estimator, gdpo_reward_keys=GDPO_KEYS)
    out = ray_trainer.compute_advantage(data, adv_estimator=estimator, config=config)
    return out.batch["advantages"]


def _exact_on_kept_rows(estimator: str, seed: int) -> bool:
    data, kept = _batch(estimator, seed)
    full = _advantages(data, estimator)
    alone = _advantages(data[kept.numpy()], estimator)
    aborted_untrained = not full[~kept].any()
    return aborted_untrained and torch.allclose(full[kept], alone, rtol=1e-5, atol=1e-6)


REGISTERED = sorted(core_algos.ADV_ESTIMATOR_REGISTRY)


# Refused although the formula is exact on the kept rows: the reason lies outside the estimator function.
REFUSED_FOR_ANOTHER_REASON = {"gae", "remax"}
# verl 0.7.1's own compute_advantage cannot call these (it passes ``config=``, which they do not take).
VERL_CANNOT_RUN = {"optimal_token_baseline", "tir_optimal_token_baseline"}


@pytest.mark.parametrize("estimator", REGISTERED)
def test_table_says_exact_exactly_where_verls_estimator_is(estimator):
    assert estimator in ESTIMATORS_WITH_ABORTED_GROUPS, f"{estimator}: registered in verl but not in the table"
    if estimator in VERL_CANNOT_RUN:
        data, kept = _batch(estimator)
        with pytest.raises(TypeError, match="config"):  # even without an aborted row: verl's own failure
            _advantages(data[kept.numpy()], estimator)
        assert ESTIMATORS_WITH_ABORTED_GROUPS[estimator] is not None
        return
    exact = [_exact_on_kept_rows(estimator, seed) for seed in range(3)]
    if ESTIMATORS_WITH_ABORTED_GROUPS[estimator] is None:
        assert all(exact), f"{estimator}: the table says exact, the kept rows' advantages differ (seeds {exact})"
    elif estimator not in REFUSED_FOR_ANOTHER_REASON:
        assert not all(exact), f"{estimator}: exact, yet refused: {ESTIMATORS_WITH_ABORTED_GROUPS[estimator]}"


def test_the_batches_tell_a_batch_wide_statistic_apart():
    """Controls: the check sees a difference where a statistic takes the aborted rows in."""
    assert not _exact_on_kept_rows("gpg", 0)  # alpha = rows / rows with a non-zero score counts the aborted rows
    data, kept = _batch("opo")
    assert _advantages(data, "opo")[~kept].isnan().all()  # 0 / 0: an aborted group's length-weighted baseline
    assert _exact_on_kept_rows("grpo", 0)


def _config(estimator: str, **overrides):
    config = {
        "algorithm": {"adv_estimator": estimator},
        "actor_rollout_ref": {"model": {"external_lib": "treetune_verl.verl.process_setup"}, "rollout": {}},
        "trainer": {"use_legacy_worker_impl": "auto"},
    }
    return OmegaConf.merge(OmegaConf.create(config), OmegaConf.create(overrides))


@pytest.mark.parametrize("estimator", REGISTERED)
def test_start_up_check_follows_the_table(estimator):
    reason = ESTIMATORS_WITH_ABORTED_GROUPS[estimator]
    if reason is None:
        check_over_sample_config(_config(estimator))
    else:
        with pytest.raises(ValueError, match=rf"adv_estimator={estimator}.*grpo"):
            check_over_sample_config(_config(estimator))


def test_an_estimator_the_table_does_not_know_is_refused_naming_supported_ones():
    assert "grpo" in supported_with_aborted_groups() and "gpg" not in supported_with_aborted_groups()
    with pytest.raises(ValueError, match="adv_estimator=my_estimator.*not checked.*grpo"):
        check_over_sample_config(_config("my_estimator"))


def test_a_critic_is_refused():
    with pytest.raises(ValueError, match="critic.enable"):
        check_over_sample_config(_config("grpo", critic={"enable": True}))
