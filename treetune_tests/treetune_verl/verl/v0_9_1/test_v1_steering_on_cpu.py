# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Entropy steering in verl 0.9.1's V1 trainer: the advantages our ``_compute_advantage`` seam writes back to a real
TransferQueue (on a local Ray) are exactly the hand-computed ones, per row, at each row's own length; verl's padding
row keeps its advantages. The rows are put as verl's trainer leaves them after its own advantage computation (the
wrapped method here is the identity: verl's advantages are already in TransferQueue)."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from treetune_verl.batch_keys import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.ppo.entropy_advantage import EntropySteering
from treetune_verl.trainer.features import RunFeatures

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

KEYS = ["a_0_0", "b_0_0", "c_0_0", "pad_0_0"]
PADDING = [False, False, False, True]
ENTROPY = [[0.5, 2.0, 1.0], [3.0, 0.2, 0.0, 1.5, 2.5], [0.1, 4.0], [0.0]]
MASK = [[1, 1, 1], [1, 1, 0, 1, 1], [1, 1], [0]]  # the third token of row b is not the model's
ADVANTAGES = [[1.0] * 3, [-2.0] * 5, [0.5] * 2, [0.0]]


@pytest.fixture(scope="module")
def transfer_queue():
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(
        address="local", num_cpus=4, include_dashboard=False, _system_config={"prestart_worker_first_driver": False}
    )
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    ray.shutdown()


def _rows(tq):
    """The four rows in TransferQueue, as verl leaves them after its advantages; their ``KVBatchMeta``."""
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    rows = [
        {
            "response_mask": torch.tensor(mask),
            "advantages": torch.tensor(advantages),
            ROLLOUT_ENTROPY_KEY: torch.tensor(entropy),
            HAS_ROLLOUT_ENTROPY_KEY: torch.tensor(not pad),
        }
        for mask, advantages, entropy, pad in zip(MASK, ADVANTAGES, ENTROPY, PADDING, strict=True)
    ]
    tags = [{"is_padding": True} if pad else {} for pad in PADDING]
    tq.kv_batch_put(keys=KEYS, partition_id="train", fields=list_of_dict_to_tensordict(rows), tags=tags)
    return KVBatchMeta(keys=KEYS, tags=tags, partition_id="train")


def _steered(tq, steering: EntropySteering, monkeypatch) -> tuple[list[list[float]], dict[str, float]]:
    from treetune_verl.verl.v0_9_1 import trainer_seams

    monkeypatch.setattr(trainer_seams, "_FEATURES", RunFeatures(rollout_entropy=True, steering=steering))
    compute_advantage = trainer_seams._wrap_compute_advantage(lambda self, batch, metrics: batch)
    metrics: dict[str, float] = {}
    batch = compute_advantage(None, _rows(tq), metrics)
    written = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages"])["advantages"]
    return [row.tolist() for row in written.unbind(0)], metrics


def test_forking_tokens_keep_exactly_the_top_share_per_row(transfer_queue, monkeypatch):
    # 9 model tokens; q = 0.5 keeps ceil(4.5) = 5: entropies 4.0, 3.0, 2.5, 2.0, 1.5 (threshold 1.5)
    advantages, metrics = _steered(transfer_queue, EntropySteering(pg_token_quantile=0.5), monkeypatch)
    assert advantages == [[0.0, 1.0, 0.0], [-2.0, 0.0, -2.0, -2.0, -2.0], [0.0, 0.5], [0.0]]
    assert metrics["pg_token_mask/threshold"] == 1.5 and metrics["pg_token_mask/kept_share"] == 5 / 9


def test_advantage_shaping_adds_the_capped_bonus_at_model_tokens(transfer_queue, monkeypatch):
    # A + min(0.5 H, |A| / 2) at model tokens, A elsewhere
    steering = EntropySteering(shaping_alpha=0.5, shaping_kappa=2.0)
    advantages, metrics = _steered(transfer_queue, steering, monkeypatch)
    expected = [[1.25, 1.5, 1.5], [-1.0, -1.9, -2.0, -1.25, -1.0], [0.55, 0.75], [0.0]]
    for got, want in zip(advantages, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    assert "entropy_advantage/bonus_mean" in metrics
