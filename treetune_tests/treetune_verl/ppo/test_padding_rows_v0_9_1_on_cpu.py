# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every advantage estimator and every ``loss_agg_mode`` of verl 0.9.1 with the padding rows its V1 trainer adds:
exact or refused.

With over-sampling on verl 0.9.1's V1 trainer the aborted groups never reach the trainer, so the batch is smaller
than ``train_batch_size`` and ``PPOTrainer._balance_batch`` pads it to a multiple of lcm(dp, ppo_mini_batch_size * n)
with verl's synthetic rows (``verl/trainer/ppo/padding_utils.py``). The padding here is verl's own
``upsample_batch_to_divisible_size`` over a dict standing in for TransferQueue (the two calls it makes), so each
padding row is exactly verl's: one ``pad<hex>`` uid shared by all of them, a 1-token response with ``response_mask`` 0,
``rm_scores`` 0, ``rollout_log_probs`` 0; the model's outputs on it (old / ref log-probs, values) are as finite and
non-zero as on any row.

- Estimators: verl's own ``compute_advantage_for_multi_trajectories`` runs as ``PPOTrainer._compute_advantage`` calls it
  (the same fields fetched, padded the same way, each row's result cut back to its own length as V1 writes it back;
  ``use_kl_in_reward`` and ``rollout_correction`` off, verl's defaults) on 3 kept groups of 4 rows plus verl's padding
  rows (16 rows, reordered as ``_balance_batch`` might), and on the kept rows alone. Exact: the kept rows' advantages
  and returns agree and the padding rows' stay finite, for 3 seeds. ``ESTIMATORS_WITH_PADDING_ROWS``
  (``treetune_verl/ppo/advantage.py``) must say *exact* exactly there, and know every estimator verl registers.
- Loss aggregation: ``core_algos.agg_loss`` on a mini-batch of kept rows plus padding rows, in micro-batches, with the
  arguments V1's workers pass, against the kept rows as an unpadded mini-batch. ``LOSS_AGG_MODES_WITH_PADDING_ROWS``
  must say *exact* exactly where the two losses are equal.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import uuid
from unittest import mock

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos

from treetune_verl.ppo.advantage import (
    ESTIMATORS_WITH_PADDING_ROWS,
    LOSS_AGG_MODES_WITH_PADDING_ROWS,
    supported_with_padding_rows,
)

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

PROMPT_LENGTH, MAX_RESPONSE_LENGTH, GROUP, KEPT_GROUPS, PADDED_ROWS = 2, 6, 4, 3, 16
EOS = 2
SEEDS = range(3)

# What V1's ``_compute_advantage`` fetches from TransferQueue, all it passes on to the estimator.
V1_ADVANTAGE_FIELDS = [
    "uid",
    "response_mask",
    "rm_scores",
    "rollout_log_probs",
    "old_log_probs",
    "ref_log_prob",
    "values",
]
# Estimators V1's ``_compute_advantage`` cannot run at all (the input is never fetched): verl's own failure, padded or
# not. The table must refuse them.
V1_CANNOT_RUN = {
    "gdpo": (KeyError, "prompts"),
    "remax": (TypeError, "reward_baselines"),
    "optimal_token_baseline": (AssertionError, "sum_pi_squared"),
    "tir_optimal_token_baseline": (AssertionError, "sum_pi_squared"),
}
REGISTERED = sorted(set(core_algos.ADV_ESTIMATOR_REGISTRY) | {"gae"})  # gae: compute_advantage dispatches it itself


class _DictTransferQueue:
    """The two TransferQueue calls ``upsample_batch_to_divisible_size`` makes, over a dict of rows (no Ray)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def kv_batch_put(self, keys, partition_id, fields, tags=None):
        for i, key in enumerate(keys):
            row = fields[i]
            self.rows.setdefault(key, {}).update({name: row[name] for name in row.keys()})  # noqa: SIM118

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        names = select_fields or list(self.rows[keys[0]])
        return list_of_dict_to_tensordict([{name: self.rows[key][name] for name in names} for key in keys])


def _rollout(seed: int, pad: bool):
    """A step's batch as V1 holds it after ``_balance_batch`` (verl's padding with ``pad``) and the model's passes.

    Returns ``(store, batch)``: the rows by key and verl's ``KVBatchMeta``. A kept row's inputs depend on ``seed``
    only, so they are the same padded or not.
    """
    from verl.trainer.ppo import padding_utils
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    generator = torch.Generator().manual_seed(seed)
    store, keys, tags = _DictTransferQueue(), [], []
    rows = []
    for group in range(KEPT_GROUPS):
        uid = uuid.UUID(int=1000 * seed + group).hex  # verl's uids are uuid4 hex: no "_" (keys split on it)
        for session in range(GROUP):
            length = int(torch.randint(1, MAX_RESPONSE_LENGTH + 1, (1,), generator=generator))
            rm_scores = torch.zeros(length)
            rm_scores[-1] = float(torch.randint(0, 3, (1,), generator=generator)) / 2  # 0, 0.5, 1: ties and spread
            prompts = torch.randint(3, 50, (PROMPT_LENGTH,), generator=generator)
            responses = torch.randint(3, 50, (length,), generator=generator)
            input_ids = torch.cat([prompts, responses])
            rows.append(
                {  # the fields verl 0.9.1's agent loop puts (agent_loop_tq.py), loss_mask = response_mask
                    "uid": uid,
                    "prompts": prompts,
                    "responses": responses,
                    "input_ids": input_ids,
                    "attention_mask": torch.ones_like(input_ids),
                    "position_ids": torch.arange(input_ids.numel()),
                    "response_mask": torch.ones(length, dtype=torch.int64),
                    "loss_mask": torch.ones(length, dtype=torch.int64),
                    "rm_scores": rm_scores,
                    "rollout_log_probs": -torch.rand(length, generator=generator) * 3,
                    "num_turns": 2,
                }
            )
            keys.append(f"{uid}_{session}_0")  # {uid}_{session_id}_{index}
            tags.append({"prompt_len": PROMPT_LENGTH, "response_len": length, "seq_len": PROMPT_LENGTH + length})
    store.kv_batch_put(keys, "train", list_of_dict_to_tensordict(rows))
    batch = padding_utils.KVBatchMeta(keys=keys, tags=tags, partition_id="train")
    if pad:
        with mock.patch.object(padding_utils, "tq", store):
            batch = padding_utils.upsample_batch_to_divisible_size(batch, PADDED_ROWS, eos_token_id=EOS)
        assert len(batch) == PADDED_ROWS and sum(tag.get("is_padding", False) for tag in batch.tags) == 4
    # The model's passes, at each row's response length (a padding row's 1 token included, as on any row).
    for key in batch.keys:
        length = store.rows[key]["response_mask"].numel()
        store.rows[key]["old_log_probs"] = -torch.rand(length, generator=generator) * 3
        store.rows[key]["ref_log_prob"] = -torch.rand(length, generator=generator) * 3
        store.rows[key]["values"] = torch.randn(length, generator=generator)
    if pad:  # _balance_batch reorders the padded batch (by sequence length, over dp ranks): padding rows interleave
        batch.reorder(torch.randperm(len(batch), generator=generator).tolist())
    return store, batch


def _v1_compute_advantage(store: _DictTransferQueue, batch, estimator: str) -> dict[str, tuple]:
    """verl 0.9.1's ``PPOTrainer._compute_advantage`` (trainer_base.py), TransferQueue replaced by ``store``.

    Returns ``{key: (advantages, returns)}``, each at the row's own response length (what V1 writes back).
    """
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
    from verl.workers.utils.padding import response_to_nested

    algorithm = OmegaConf.structured(AlgoConfig(adv_estimator=estimator, gdpo_reward_keys=["accuracy", "format"]))
    data = store.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=V1_ADVANTAGE_FIELDS)
    response_mask = data["response_mask"]
    data = DataProto(batch=data.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]  # use_kl_in_reward=False
    data = compute_advantage_for_multi_trajectories(
        data,
        batch_keys=batch.keys,
        adv_estimator=algorithm.adv_estimator,
        gamma=algorithm.gamma,
        lam=algorithm.lam,
        num_repeat=GROUP,
        norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
        config=algorithm,
    )
    advantages = response_to_nested(data.batch["advantages"], response_mask)
    returns = response_to_nested(data.batch["returns"], response_mask)
    return {key: (advantages[i], returns[i]) for i, key in enumerate(batch.keys)}


def _padded_and_alone(estimator: str, seed: int) -> tuple[dict, dict]:
    """``estimator``'s results on the padded batch and on its kept rows alone, by key."""
    padded = _v1_compute_advantage(*_rollout(seed, pad=True), estimator)
    alone = _v1_compute_advantage(*_rollout(seed, pad=False), estimator)
    return padded, alone


def _exact_with_padding_rows(estimator: str, seed: int) -> bool:
    padded, alone = _padded_and_alone(estimator, seed)
    assert set(alone) < set(padded)
    kept_agree = all(
        torch.allclose(padded[key][i], alone[key][i], rtol=1e-5, atol=1e-6) for key in alone for i in range(2)
    )
    padding_finite = all(torch.isfinite(padded[key][i]).all() for key in set(padded) - set(alone) for i in range(2))
    return kept_agree and padding_finite


def test_the_table_knows_exactly_verls_estimators():
    assert set(ESTIMATORS_WITH_PADDING_ROWS) == set(REGISTERED), "verl 0.9.1's registry and the table differ"
    assert supported_with_padding_rows() == sorted(
        name for name, reason in ESTIMATORS_WITH_PADDING_ROWS.items() if reason is None
    )
    assert {"grpo", "rloo", "grpo_valid"} <= set(supported_with_padding_rows())


@pytest.mark.parametrize("estimator", sorted(set(REGISTERED) | set(ESTIMATORS_WITH_PADDING_ROWS)))
def test_table_says_exact_exactly_where_verls_estimator_is(estimator):
    assert estimator in ESTIMATORS_WITH_PADDING_ROWS, f"{estimator}: registered in verl but not in the table"
    assert estimator in REGISTERED, f"{estimator}: in the table but not registered in verl 0.9.1"
    if estimator in V1_CANNOT_RUN:
        error, match = V1_CANNOT_RUN[estimator]
        with pytest.raises(error, match=match):  # even without a padding row: verl's own failure
            _v1_compute_advantage(*_rollout(0, pad=False), estimator)
        assert ESTIMATORS_WITH_PADDING_ROWS[estimator] is not None
        return
    exact = [_exact_with_padding_rows(estimator, seed) for seed in SEEDS]
    if ESTIMATORS_WITH_PADDING_ROWS[estimator] is None:
        assert all(exact), (
            f"{estimator}: the table says exact; with padding rows the kept rows differ or a padding row is not finite (seeds {exact})"
        )
    else:
        assert not any(exact), (
            f"{estimator}: exact (seeds {exact}), yet refused: {ESTIMATORS_WITH_PADDING_ROWS[estimator]}"
        )


def test_grpo_kept_rows_by_hand_and_padding_rows_zero():
    """Independent reference: GRPO on a kept group is (score - group mean) / (group std + 1e-6), per row."""
    store, batch = _rollout(0, pad=True)
    padded = _v1_compute_advantage(store, batch, "grpo")
    for key in batch.keys:
        row = store.rows[key]
        if row["uid"].startswith("pad"):
            assert padded[key][0].tolist() == [0.0]
            continue
        group = torch.stack(
            [store.rows[k]["rm_scores"].sum() for k in batch.keys if store.rows[k]["uid"] == row["uid"]]
        )
        expected = (row["rm_scores"].sum() - group.mean()) / (group.std() + 1e-6)
        assert torch.allclose(padded[key][0], expected.expand(row["rm_scores"].numel()), rtol=1e-5, atol=1e-6)


def test_the_batches_tell_a_padding_statistic_apart():
    """Controls: the check sees a statistic that counts the padding rows, and a NaN on a padding row."""
    padded, alone = _padded_and_alone("gpg", 0)
    kept_scale = {(padded[key][0] / alone[key][0])[0].item() for key in alone if alone[key][0].abs().sum() > 0}
    # alpha = rows / rows with a non-zero score: 16 / m padded, 12 / m alone
    assert kept_scale and all(abs(scale - PADDED_ROWS / (KEPT_GROUPS * GROUP)) < 1e-5 for scale in kept_scale)
    padded, alone = _padded_and_alone("opo", 0)
    assert all(torch.allclose(padded[key][0], alone[key][0], rtol=1e-5, atol=1e-6) for key in alone)
    assert all(padded[key][0].isnan().all() for key in set(padded) - set(alone))  # the padding group's 0 / 0


def test_a_nan_advantage_on_a_padding_row_reaches_the_actors_gradient():
    """Why ``opo`` is refused: verl's masked loss is finite, its gradient is not (NaN * 0 in the backward)."""
    from omegaconf import OmegaConf

    config = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
        }
    )
    advantages = torch.tensor([[1.0, -0.5, 0.0], [float("nan"), 0.0, 0.0]])  # a kept row, a padding row
    response_mask = torch.tensor([[True, True, False], [False, False, False]])
    log_prob = torch.zeros(2, 3, requires_grad=True)
    loss, _ = core_algos.compute_policy_loss_vanilla(
        torch.zeros(2, 3), log_prob, advantages, response_mask, "token-mean", config
    )
    loss.backward()
    assert torch.isfinite(loss) and log_prob.grad[1, 0].isnan()


# ---------------------------------------------------------------------------------------------------------------------
# loss_agg_mode


def _agg_loss_modes() -> set[str]:
    """The modes ``core_algos.agg_loss`` branches on (``loss_agg_mode == "..."`` / ``in [...]``), read from its source."""
    modes = set()
    for node in ast.walk(ast.parse(inspect.getsource(core_algos.agg_loss))):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "loss_agg_mode":
            for comparator in node.comparators:
                for constant in ast.walk(comparator):
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                        modes.add(constant.value)
    return modes


MINI_BATCH_ROWS, MICRO_BATCH_ROWS, PADDING_IN_MINI_BATCH = 8, 4, 2  # ppo_mini_batch_size * n = 8 rows


def _mini_batch(seed: int) -> list[dict]:
    """A padded mini-batch's rows: ``loss`` (per token, finite on every row) and ``mask``; verl's padding rows have one
    token with ``loss_mask`` 0 (the padded log-probs are finite there)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(MINI_BATCH_ROWS - PADDING_IN_MINI_BATCH):
        length = int(torch.randint(1, MAX_RESPONSE_LENGTH + 1, (1,), generator=generator))
        rows.append({"loss": torch.randn(length, generator=generator), "mask": torch.ones(length), "padding": False})
    for _ in range(PADDING_IN_MINI_BATCH):
        rows.append({"loss": torch.randn(1, generator=generator), "mask": torch.zeros(1), "padding": True})
    order = torch.randperm(len(rows), generator=generator).tolist()
    return [rows[i] for i in order]


def _micro_batches(rows: list[dict]) -> list[list[dict]]:
    return [rows[i : i + MICRO_BATCH_ROWS] for i in range(0, len(rows), MICRO_BATCH_ROWS)]


def _padded(rows: list[dict], name: str) -> torch.Tensor:
    """``[rows, longest]`` as ``to_padded_tensor`` gives it in V1's ``ppo_loss`` (a micro-batch's own longest row)."""
    width = max(row[name].numel() for row in rows)
    return torch.stack([torch.nn.functional.pad(row[name], (0, width - row[name].numel())) for row in rows])


def _v1_mini_batch_loss(micro_batches: list[list[dict]], mode: str, global_batch_size: int) -> float:
    """The mini-batch's loss: the sum of its micro-batches' ``agg_loss`` with V1's arguments (dp_size 1;
    ``batch_num_tokens`` = the mini-batch's loss_mask sum, FSDP engine ``forward_backward_batch``;
    ``global_batch_size`` from the trainer; ``loss_scale_factor`` = actor.loss_scale_factor, None by default)."""
    batch_num_tokens = int(sum(row["mask"].sum() for micro in micro_batches for row in micro))
    total = 0.0
    for micro in micro_batches:
        total += core_algos.agg_loss(
            loss_mat=_padded(micro, "loss"),
            loss_mask=_padded(micro, "mask"),
            loss_agg_mode=mode,
            dp_size=1,
            batch_num_tokens=batch_num_tokens,
            global_batch_size=global_batch_size,
            loss_scale_factor=None,
        ).item()
    return total


def _by_hand(micro_batches: list[list[dict]], mode: str, rows_in_mini_batch: int) -> float:
    """Independent reference, from each row's own tokens (no padded tensor)."""
    kept = [row for micro in micro_batches for row in micro if row["mask"].sum() > 0]
    if mode == "token-mean":
        return sum(row["loss"].sum().item() for row in kept) / sum(row["loss"].numel() for row in kept)
    if mode == "token-sum":
        return sum(row["loss"].sum().item() for row in kept)
    if mode == "seq-mean-token-mean":
        return sum(row["loss"].mean().item() for row in kept) / rows_in_mini_batch
    if mode == "seq-mean-token-sum":
        return sum(row["loss"].sum().item() for row in kept) / rows_in_mini_batch
    if mode == "seq-mean-token-sum-norm":  # each micro-batch divided by its own width (loss_scale_factor None)
        return (
            sum(
                sum(row["loss"].sum().item() for row in micro if row["mask"].sum() > 0)
                / max(row["mask"].numel() for row in micro)
                for micro in micro_batches
            )
            / rows_in_mini_batch
        )
    raise AssertionError(f"no reference for {mode}")


def test_the_table_knows_exactly_verls_loss_agg_modes():
    modes = _agg_loss_modes()
    assert modes == set(LOSS_AGG_MODES_WITH_PADDING_ROWS), "verl 0.9.1's agg_loss modes and the table differ"
    with pytest.raises(ValueError, match="Invalid loss_agg_mode"):
        core_algos.agg_loss(torch.zeros(1, 1), torch.ones(1, 1), "not-a-mode")


@pytest.mark.parametrize("mode", sorted(_agg_loss_modes() | set(LOSS_AGG_MODES_WITH_PADDING_ROWS)))
def test_loss_table_says_exact_exactly_where_the_padded_mini_batch_loss_is(mode):
    assert mode in LOSS_AGG_MODES_WITH_PADDING_ROWS, f"{mode}: an agg_loss mode the table does not know"
    exact = []
    for seed in SEEDS:
        padded_micro_batches = _micro_batches(_mini_batch(seed))
        kept_micro_batches = [[row for row in micro if not row["padding"]] for micro in padded_micro_batches]
        kept_rows = MINI_BATCH_ROWS - PADDING_IN_MINI_BATCH
        # V1: global_batch_size = ppo_mini_batch_size * n rows, the padding rows counted; unpadded, the kept rows
        padded = _v1_mini_batch_loss(padded_micro_batches, mode, global_batch_size=MINI_BATCH_ROWS)
        alone = _v1_mini_batch_loss(kept_micro_batches, mode, global_batch_size=kept_rows)
        assert padded == pytest.approx(_by_hand(padded_micro_batches, mode, MINI_BATCH_ROWS), rel=1e-5, abs=1e-6)
        assert alone == pytest.approx(_by_hand(kept_micro_batches, mode, kept_rows), rel=1e-5, abs=1e-6)
        exact.append(abs(padded - alone) <= 1e-6)
    if LOSS_AGG_MODES_WITH_PADDING_ROWS[mode] is None:
        assert all(exact), f"{mode}: the table says exact, the padded mini-batch's loss differs (seeds {exact})"
    else:
        assert not any(exact), f"{mode}: exact (seeds {exact}), yet refused: {LOSS_AGG_MODES_WITH_PADDING_ROWS[mode]}"
