# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Carry-over's trainer seams around verl 0.7.1's real ``RayPPOTrainer`` methods: ``fit`` (the bounded dataloader),
``_get_gen_batch`` (the slots; refused over an unbounded dataloader), ``_validate`` (left alone), ``_save_checkpoint``
/ ``_load_checkpoint`` (the carried groups and the backlog survive a resume).

verl's own methods run (its ``_get_gen_batch`` split, its checkpoint folders, ``latest_checkpointed_iteration.txt``
and ``find_latest_ckpt_path``); the actor worker group and the dataloader they save are stand-ins that record the
calls (they need GPUs and a dataset; the whole run resumes in ``treetune_tests/e2e``).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.trainer.ppo import ray_trainer

from treetune_verl.agent_loop.carry_over import BoundedLoader, CarriedRow, CarryOver
from treetune_verl.patching import original_of
from treetune_verl.trainer.features import RunFeatures
from treetune_verl.verl.v0_7_1 import trainer_seams as seams


def _batch(names: str) -> DataProto:
    raw = np.empty(len(names), dtype=object)
    raw[:] = [[{"role": "user", "content": name}] for name in names]
    return DataProto.from_dict(
        tensors={"dummy_tensor": torch.zeros(len(names), 1)},
        non_tensors={
            "uid": np.array(list(names), dtype=object),
            "raw_prompt": raw,
            "data_source": np.array(["d"] * len(names), dtype=object),
        },
    )


def _carrying(names: str = "ABCD", aborted: str = "D", step: int = 1) -> CarryOver:
    """A buffer after one step of ``names`` where the groups in ``aborted`` were cut (2 rows each, 3 tokens)."""
    carry = CarryOver(max_staleness=2, slots=len(names), most_carried=1)
    batch = _batch(names)
    carry.fill_slots(batch, step)
    uids = np.repeat(batch.non_tensor_batch["uid"], 2)
    row = CarriedRow([1], [5, 6, 7], [-0.5] * 3, [0.1] * 3, [step] * 3, finished=False)
    records = np.array([row if uid in aborted else None for uid in uids], dtype=object)
    cut = np.array([uid in aborted for uid in uids])
    carry.keep_aborted(uids, carry.resume_column(uids), records, cut, np.zeros_like(cut), np.full(len(uids), 3), step)
    return carry


def _trainer(carry: CarryOver | None, workdir=None, resume_mode: str = "auto", resume_from_path=None):
    seams.install(RunFeatures(), carry)  # the buffer trainer_setup creates and hands to the seams and the manager
    trainer = object.__new__(ray_trainer.RayPPOTrainer)
    trainer.global_steps = 0
    trainer.config = OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": str(workdir),
                "default_hdfs_dir": None,
                "resume_mode": resume_mode,
                "resume_from_path": resume_from_path,
                "del_local_ckpt_after_load": False,
            },
            "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}},
        }
    )
    trainer.use_critic = False
    trainer.actor_rollout_wg = SimpleNamespace(calls=[])
    trainer.actor_rollout_wg.save_checkpoint = lambda path, *a, **k: trainer.actor_rollout_wg.calls.append(
        ("save", path)
    )
    trainer.actor_rollout_wg.load_checkpoint = lambda path, **k: trainer.actor_rollout_wg.calls.append(("load", path))
    loader = SimpleNamespace(state_dict=lambda: {"seen": 12}, load_state_dict=lambda state: None)
    trainer.train_dataloader = BoundedLoader(loader, carry) if carry is not None else loader  # as the fit seam does
    return trainer


@pytest.fixture(autouse=True)
def _no_buffer_left_behind():
    """The seams' buffer is the process's (one run per trainer process): later tests in this process start without."""
    yield
    seams.install(RunFeatures())


GET_GEN_BATCH = seams._wrap_get_gen_batch(original_of(ray_trainer.RayPPOTrainer._get_gen_batch))
FIT = seams._wrap_fit(lambda self: self.train_dataloader)  # verl's fit would train: what it would iterate
SAVE = seams._wrap_save_checkpoint(original_of(ray_trainer.RayPPOTrainer._save_checkpoint))
LOAD = seams._wrap_load_checkpoint(original_of(ray_trainer.RayPPOTrainer._load_checkpoint))


def test_get_gen_batch_gives_carried_groups_their_slots_in_training_only():
    carry = _carrying()
    trainer = _trainer(carry)
    trainer.global_steps = 2
    batch = _batch("EFGH")
    gen_batch = GET_GEN_BATCH(trainer, batch)
    # D first, with its own prompt; then E, F, G; H waits. verl's split as always: raw_prompt to the generation
    assert list(batch.non_tensor_batch["uid"]) == list("DEFG") == list(gen_batch.non_tensor_batch["uid"])
    assert [m[0]["content"] for m in gen_batch.non_tensor_batch["raw_prompt"]] == list("DEFG")
    assert "raw_prompt" not in batch.non_tensor_batch and carry.backlog == 1

    # inside verl's _validate (wrapped): the validation batch is left as it is
    carry = _carrying()
    trainer = _trainer(carry)
    seen = []
    validate = seams._wrap_validate(lambda self, merged=False: seen.append(GET_GEN_BATCH(self, _batch("VW"))))
    validate(trainer)
    assert list(seen[0].non_tensor_batch["uid"]) == ["V", "W"] and carry.carried_groups == 1 and carry.backlog == 0
    # no carry-over: verl's own
    assert list(GET_GEN_BATCH(_trainer(None), _batch("XY")).non_tensor_batch["uid"]) == ["X", "Y"]


def test_fit_bounds_the_dataloader_once_and_the_slots_refuse_an_unbounded_one():
    carry = _carrying()
    trainer = _trainer(None)  # verl's dataloader, as verl built it
    seams.install(RunFeatures(), carry)
    loader = trainer.train_dataloader
    bounded = FIT(trainer)
    assert isinstance(bounded, BoundedLoader) and bounded.loader is loader and FIT(trainer) is bounded
    assert bounded.state_dict() == {"seen": 12}  # verl saves the dataloader's own position
    trainer.train_dataloader = loader  # a trainer whose fit is not RayPPOTrainer.fit
    with pytest.raises(RuntimeError, match="not carry_over.BoundedLoader"):
        GET_GEN_BATCH(trainer, _batch("EFGH"))


def test_a_resumed_run_gets_back_the_carried_groups_and_the_backlog(tmp_path, caplog):
    carry = _carrying()
    trainer = _trainer(carry, tmp_path)
    trainer.global_steps = 2
    GET_GEN_BATCH(trainer, _batch("EFGH"))  # D resumed; H in the backlog
    carry.keep_aborted(  # step 2 cuts E
        np.repeat(np.array(list("DEFG"), dtype=object), 2),
        np.array([None] * 8, dtype=object),
        np.array([None, None, CarriedRow([1], [4], [-0.1], [0.2], [2], False), None] + [None] * 4, dtype=object),
        np.array([False, False, True, True, False, False, False, False]),
        np.zeros(8, dtype=bool),
        np.full(8, 3),
        2,
    )
    SAVE(trainer)  # verl's own save, our state first
    assert (tmp_path / "global_step_2" / seams.CARRY_OVER_STATE_FILE).exists()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert trainer.actor_rollout_wg.calls == [("save", str(tmp_path / "global_step_2" / "actor"))]

    restored = CarryOver(max_staleness=2, slots=4, most_carried=1)
    resumed = _trainer(restored, tmp_path)
    LOAD(resumed)  # verl finds the latest checkpoint and sets global_steps; we restore the buffer from it
    assert resumed.global_steps == 2
    assert restored.carried_groups == 1 and restored.carried("E")[0].response_ids == [4]
    assert restored.backlog == 1
    resumed.global_steps = 3
    batch = _batch("IJKL")
    GET_GEN_BATCH(resumed, batch)
    assert list(batch.non_tensor_batch["uid"]) == list("EHIJ")  # E resumes, then the backlog's H, then the new ones

    by_path_carry = CarryOver(max_staleness=2, slots=4, most_carried=1)
    by_path = _trainer(by_path_carry, tmp_path / "elsewhere", "resume_path", str(tmp_path / "global_step_2"))
    LOAD(by_path)
    assert by_path_carry.carried_groups == 1

    (tmp_path / "global_step_2" / seams.CARRY_OVER_STATE_FILE).unlink()  # a checkpoint saved without carry-over
    fresh_carry = CarryOver(max_staleness=2, slots=4, most_carried=1)
    fresh = _trainer(fresh_carry, tmp_path)
    with caplog.at_level(logging.WARNING, logger=seams.__name__):
        LOAD(fresh)
    assert fresh_carry.carried_groups == 0 and "not found" in caplog.text
