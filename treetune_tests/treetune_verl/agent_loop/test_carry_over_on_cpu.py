# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The carry-over buffer on verl's real ``DataProto``: slots, backlog, what each row resumes, staleness, metrics
(hand-computed values); the start-up refusals of the keys. The real-Engine path: ``test_carry_over_standalone_on_cpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto

from treetune_verl.agent_loop.carry_over import CarriedRow, CarryOver, carried_row
from treetune_verl.trainer.features import check_current_stack, check_features
from treetune_verl.trainer.metrics import CARRY_OVER_METRICS

PREFIX = "rollout/carry_over/"


def _batch(names: str) -> DataProto:
    """The dataloader's prompts as ``fit`` holds them: one row each, ``uid`` and the dataset's columns."""
    raw = np.empty(len(names), dtype=object)
    raw[:] = [[{"role": "user", "content": name}] for name in names]
    batch = DataProto.from_dict(
        tensors={"dummy_tensor": torch.arange(len(names)).unsqueeze(-1)},
        non_tensors={"uid": np.array(list(names), dtype=object), "raw_prompt": raw},
    )
    batch.meta_info["temperature"] = 1.0
    return batch


def _row(tokens: int, step: int, finished: bool = False) -> CarriedRow:
    return CarriedRow(
        prompt_ids=[1, 2],
        response_ids=list(range(tokens)),
        log_probs=[-1.0] * tokens,
        entropy=[0.5] * tokens,
        token_steps=[step] * tokens,
        finished=finished,
    )


def _step(carry: CarryOver, names: str, step: int, aborted: str = "", records=None, trained=None, n: int = 2):
    """One step: ``fill_slots``, the rows each resumes, then ``keep_aborted`` with the groups in ``aborted`` cut
    (``records``: their rows' states, by group; every kept row ``trained`` tokens, default 3)."""
    batch = _batch(names)
    carry.fill_slots(batch, step)
    uids = np.repeat(batch.non_tensor_batch["uid"], n)
    resumed = carry.resume_column(uids)
    cut = np.array([str(uid) in aborted for uid in uids])
    column = np.empty(len(uids), dtype=object)
    for group, rows in (records or {}).items():
        column[np.flatnonzero(uids == group)] = rows
    tokens = np.array([0 if c else (trained or {}).get(str(uid), 3) for uid, c in zip(uids, cut, strict=True)])
    metrics = carry.keep_aborted(uids, resumed, column, cut, np.zeros_like(cut), tokens, step)
    return batch, resumed, metrics


def test_carried_groups_take_the_first_slots_and_no_prompt_is_lost():
    carry = CarryOver(max_staleness=2, slots=4, most_carried=2)
    batch, _, metrics = _step(carry, "ABCD", 1, aborted="CD", records={"C": [_row(4, 1), _row(2, 1, True)]})
    assert list(batch.non_tensor_batch["uid"]) == list("ABCD") and carry.backlog == 0
    # D was cut with no resumable row (a loop that reports no stop reason): carried, its rows restart
    assert carry.carried("D") == [None, None] and carry.carried("A") is None
    assert metrics[PREFIX + "groups_carried"] == 2 and metrics[PREFIX + "tokens_carried"] == 6

    batch, resumed, metrics = _step(carry, "EFGH", 2)
    # C, D first (with their own prompt rows), then E, F; G, H wait
    assert list(batch.non_tensor_batch["uid"]) == list("CDEF")
    assert [m[0]["content"] for m in batch.non_tensor_batch["raw_prompt"]] == list("CDEF")
    assert batch.batch["dummy_tensor"].flatten().tolist() == [2, 3, 0, 1]
    assert carry.backlog == 2
    assert [None if r is None else len(r) for r in resumed] == [4, 2, None, None, None, None, None, None]
    assert metrics[PREFIX + "rows_trained"] == 2 and metrics[PREFIX + "tokens_trained"] == 6
    assert metrics[PREFIX + "staleness/1"] == 6
    # kept rows: 3 tokens each in the batch; C's resumed rows brought 4 and 2, so the step generated 8 * 3 - 6
    assert metrics[PREFIX + "tokens_generated"] == 8 * 3 - 6

    batch, _, _ = _step(carry, "IJKL", 3)
    # no carried group: the backlog first, in order, then the dataloader's
    assert list(batch.non_tensor_batch["uid"]) == list("GHIJ") and carry.backlog == 2
    batch, _, _ = _step(carry, "MNOP", 4)
    assert list(batch.non_tensor_batch["uid"]) == list("KLMN")


def test_a_row_past_the_staleness_bound_restarts_and_its_tokens_count_as_discarded():
    carry = CarryOver(max_staleness=1, slots=2, most_carried=1)
    _step(carry, "AB", 1, aborted="B", records={"B": [_row(5, 1), _row(3, 1, True)]})
    _, _, metrics = _step(carry, "CD", 2, aborted="B", records={"B": [_row(7, 1), _row(3, 1, True)]})
    assert carry.carried("B")[0].token_steps == [1] * 7  # resumed at 2, cut again: its tokens keep step 1
    batch, resumed, metrics = _step(carry, "EF", 3)  # staleness 2 > 1: both rows restart
    assert list(batch.non_tensor_batch["uid"]) == ["B", "D"]  # D waited in the backlog since step 2
    assert list(resumed) == [None] * 4
    assert metrics[PREFIX + "rows_restarted_stale"] == 2
    assert metrics[PREFIX + "tokens_discarded_stale"] == 10 and metrics[PREFIX + "tokens_discarded"] == 10


def test_a_group_with_a_failed_row_is_dropped_not_carried():
    carry = CarryOver(max_staleness=2, slots=2, most_carried=1)
    batch = _batch("AB")
    carry.fill_slots(batch, 1)
    uids = np.repeat(batch.non_tensor_batch["uid"], 2)
    records = np.empty(4, dtype=object)
    records[2] = _row(6, 1)
    cut, failed = np.array([False, False, True, True]), np.array([False, False, False, True])
    metrics = carry.keep_aborted(uids, carry.resume_column(uids), records, cut, failed, np.array([3, 3, 0, 0]), 1)
    assert carry.carried("B") is None and carry.carried_groups == 0
    assert metrics[PREFIX + "tokens_discarded"] == 6 and metrics[PREFIX + "discarded_share"] == 6 / 12
    # the keys verl 0.9.1's replay buffer logs too (verl/v0_9_1/test_over_sample_sampler_on_cpu.py)
    assert sorted(key for key in metrics if "/staleness/" not in key) == sorted(CARRY_OVER_METRICS)


def test_carried_row_keeps_each_tokens_step_and_knows_a_cut_row():
    cut = {"stop_reason": "abort", "sampling_params": {"temperature": 1.0}}
    resumed = _row(3, 1)
    row = carried_row([1], [7] * 5, [-0.1] * 5, [0.2] * 5, cut, resumed, step=2, response_length=8)
    assert row.token_steps == [1, 1, 1, 2, 2] and not row.finished and row.resumable
    assert row.sampling_params == {"temperature": 1.0}
    assert carried_row([1], [7] * 8, [-0.1] * 8, [0.2] * 8, cut, None, 2, 8).finished  # at the length cap
    own_cap = {"stop_reason": "abort", "sampling_params": {"max_new_tokens": 4}}
    assert carried_row([1], [7] * 4, [-0.1] * 4, [0.2] * 4, own_cap, None, 2, 8).finished  # at its request's cap
    stopped = {"stop_reason": "stop", "sampling_params": {}}
    assert carried_row([1], [7] * 2, [-0.1] * 2, [0.2] * 2, stopped, None, 2, 8).finished
    assert not carried_row([1], [7] * 2, None, [0.2] * 2, cut, None, 2, 8).resumable  # no log-probs
    assert not carried_row([1], [7] * 2, [-0.1] * 2, [0.2] * 2, None, None, 2, 8).resumable  # a loop that says nothing
    with pytest.raises(ValueError, match="3 tokens, 2 log-probs"):
        CarriedRow([1], [1, 2, 3], [0.0, 0.0], [0.0] * 3, [1] * 3, finished=False)


def test_keep_aborted_without_the_seam_says_so():
    carry = CarryOver(max_staleness=2, slots=2, most_carried=1)
    uids = np.array(["A", "A"], dtype=object)
    records = np.array([_row(2, 1), _row(2, 1)], dtype=object)
    with pytest.raises(RuntimeError, match="_get_gen_batch seam"):
        carry.keep_aborted(uids, carry.resume_column(uids), records, np.ones(2, bool), np.zeros(2, bool), [0, 0], 1)


def _config(**over_sample):
    rollout = {
        "agent": {"agent_loop_manager_class": "treetune_verl.verl.EntropyAgentLoopManager"},
        "over_sample_rate": over_sample.pop("rate", 0.25),
        "custom": {"over_sample": over_sample},
    }
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": rollout, "model": {"external_lib": "treetune_verl.verl.process_setup"}},
            "algorithm": {"adv_estimator": "grpo", "rollout_correction": {"rollout_is": "token", "bypass_mode": False}},
        }
    )


def test_start_up_checks_of_the_carry_over_keys():
    features = check_features(_config(carry_over=True, max_staleness=3))
    assert features.carry_over and features.max_staleness == 3
    assert check_features(_config(carry_over=True)).max_staleness == 2
    with pytest.raises(ValueError, match="needs over-sampling"):
        check_features(_config(carry_over=True, rate=0.0))
    no_correction = _config(carry_over=True)
    no_correction.algorithm.rollout_correction.rollout_is = None
    with pytest.raises(ValueError, match="rollout_correction.rollout_is=token"):
        check_features(no_correction)
    no_correction.algorithm.rollout_correction.bypass_mode = True
    assert check_features(no_correction).carry_over
    for bad in (0, "2", 1.5, True):
        with pytest.raises(ValueError, match="max_staleness must be an integer >= 1"):
            check_features(_config(carry_over=True, max_staleness=bad))
    with pytest.raises(ValueError, match="carry_over must be true or false"):
        check_features(_config(carry_over="yes"))
    with pytest.raises(ValueError, match="needs over-sampling"):  # verl 0.9.1 runs it too (its own checks)
        check_current_stack(_config(carry_over=True, rate=0.0), "0.9.1")


def test_over_20_steps_the_backlog_stays_bounded_and_every_prompt_of_an_epoch_trains_once():
    """verl 0.7.1's ``fit`` loop over :class:`BoundedLoader` (verl's ``StatefulDataLoader`` and ``collate_fn`` on 26
    prompts, batches of 4, ``drop_last`` as verl builds it), 20 steps, each carrying 0 or 1 group at random (over-sampling
    at 0.25 of 4 groups: ``most_carried`` 1): every step's longest wait is within the bound and the backlog under one
    batch; no prompt of an epoch is trained (kept) twice, the first epoch's every prompt is; every slot holds a group.
    Without the bound (verl's loader as it is) the same steps leave the backlog growing past a batch."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.utils.dataset.rl_dataset import collate_fn

    from treetune_verl.agent_loop.carry_over import BoundedLoader, prompt_wait_bound

    slots, most_carried, prompts = 4, 1, 26
    dataset = [
        {"input_ids": torch.tensor([i, i]), "index": i, "raw_prompt": [{"role": "user", "content": str(i)}]}
        for i in range(prompts)
    ]

    def run(bounded: bool) -> tuple[list[dict], list[int], CarryOver]:
        carry = CarryOver(max_staleness=3, slots=slots, most_carried=most_carried)
        loader = StatefulDataLoader(dataset, batch_size=slots, drop_last=True, collate_fn=collate_fn)
        loader = BoundedLoader(loader, carry) if bounded else loader
        rng, kept, metrics, step = np.random.default_rng(7), [], [], 0
        for epoch in range(10):
            for batch_dict in loader:  # fit's loop
                step += 1
                batch = DataProto.from_single_dict(batch_dict)
                # fit's fresh uids (here naming the draw's epoch and the prompt; the backlog's keep theirs)
                batch.non_tensor_batch["uid"] = np.array(
                    [f"{epoch}:{i}:{step}" for i in batch.non_tensor_batch["index"]], dtype=object
                )
                carry.fill_slots(batch, step)
                groups = list(batch.non_tensor_batch["uid"])
                uids = np.repeat(batch.non_tensor_batch["uid"], 2)
                cut_groups = set(rng.choice(groups, size=rng.integers(0, most_carried + 1), replace=False))
                cut = np.array([uid in cut_groups for uid in uids])
                records = np.array([_row(2, step) if c else None for c in cut], dtype=object)
                resumed = carry.resume_column(uids)
                metrics.append(
                    carry.keep_aborted(uids, resumed, records, cut, np.zeros_like(cut), np.where(cut, 0, 3), step)
                )
                kept += [tuple(int(part) for part in uid.split(":")[:2]) for uid in groups if uid not in cut_groups]
                if step == 20:
                    return metrics, kept, carry
        raise AssertionError("fewer than 20 steps in 10 epochs")

    metrics, kept, carry = run(bounded=True)
    bound = prompt_wait_bound(slots, most_carried)
    assert bound == 2
    assert all(m[PREFIX + "prompt_wait_max"] <= bound and m[PREFIX + "prompt_wait_bound"] == bound for m in metrics)
    assert max(m[PREFIX + "backlog"] for m in metrics) < slots
    assert max(m[PREFIX + "prompt_wait_max"] for m in metrics) >= 1  # the bound is not vacuous: prompts did wait
    # 24 prompts per epoch (drop_last: 26 // 4 batches of 4): each kept at most once per epoch, the first epoch whole
    assert len(set(kept)) == len(kept)
    assert sorted(index for epoch, index in kept if epoch == 0) == list(range(prompts // slots * slots))
    # every slot of every step held a group, kept or carried into the next step
    assert len(kept) == 20 * slots - sum(m[PREFIX + "groups_carried"] for m in metrics)

    unbounded, _, _ = run(bounded=False)
    assert [m[PREFIX + "backlog"] for m in unbounded][-1] > slots  # grows by the carried groups at every step
