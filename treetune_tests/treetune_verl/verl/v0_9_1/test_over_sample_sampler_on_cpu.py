# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling's replay buffer on verl 0.9.1, decisions only: which groups a step keeps when some of them failed.

verl's own ``ReplayBuffer.sample`` runs unchanged; TransferQueue is an in-memory stand-in for the two calls the
buffer makes (``kv_list``, ``kv_clear``: the real one needs a Ray cluster; the real path, with a real Engine and
real TransferQueue, is ``test_v1_rollout_standalone_on_cpu.py``'s over-sampling test), and the servers are the
buffer's own ``_abort`` / ``_forget`` seam, here finishing the aborted groups as a server's abort does, and the kept
rows' weight versions its ``_token_steps``.

verl marks a group ``failure`` when one of its rows raised and would train it without that row: over-sampling keeps
whole groups only, so a failed group is never taken (even when it ended first), it is aborted and removed with the
others, and a step whose failures leave fewer groups than the target can finish stops with an error, or, with failed
rows aborted (``abort_failed_rows``, also without over-sampling), trains the whole groups that finish. With carry-over
only the groups too stale for the next step and the failed ones go; the others stay, running.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from treetune_verl.trainer.metrics import ABORT_METRICS, CARRY_OVER_METRICS  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

N = 2  # rows per group


class _TransferQueueTags:
    """The tags TransferQueue's metadata holds for one partition: prompts (``is_prompt``, status) and rows."""

    def __init__(self, statuses: dict[str, str], partition: str) -> None:
        self.partition = partition
        self.tags: dict[str, dict] = {}
        for uid, status in statuses.items():
            self.set(uid, status)

    def set(self, uid: str, status: str) -> None:
        # "a" is dispatched first: verl's sample takes the oldest terminal groups first, so it would take "a"
        step = 0 if uid == "a" else 1
        self.tags[uid] = {"is_prompt": True, "status": status, "global_steps": step}
        if status in ("finished", "failure"):  # a failed group has the rows that did not raise
            rows = range(N) if status == "finished" else range(N - 1)
            self.tags.update(
                {f"{uid}_{s}_0": {"status": "success", "response_len": 4, "global_steps": step} for s in rows}
            )

    def kv_list(self, partition_id: str | None = None) -> dict:
        return {self.partition: dict(self.tags)}

    def kv_clear(self, partition_id: str, keys: list[str]) -> None:
        for key in keys:
            self.tags.pop(key, None)


def _buffer(monkeypatch, statuses: dict[str, str], partition: str = "train", **features):
    from verl.trainer.ppo.v1 import replay_buffer

    from treetune_verl.rollout.session import group_session_id
    from treetune_verl.rollout.token_ledger import TokenLedger
    from treetune_verl.trainer.features import RunFeatures
    from treetune_verl.verl.v0_9_1.over_sample_sampler import OverSampleReplayBuffer

    store = _TransferQueueTags(statuses, partition)
    monkeypatch.setattr(replay_buffer, "tq", store)
    ledger = TokenLedger()

    class Buffer(OverSampleReplayBuffer):
        aborted: list[str] = []
        forgotten: list[str] = []

        def _features(self) -> RunFeatures:
            return RunFeatures(**{"over_sample_rate": 0.5, **features})

        def _token_steps(self, batch):  # the kept rows' weight versions (extra_fields): 3 tokens per row, of step 0
            return [[0] * 3 for _ in range(len(batch))]

        def _generated_tokens(self):  # the servers' ledger (rollout/token_ledger.py)
            return ledger.take_generated()

        def _session_tokens(self, sessions, forget=False):
            return ledger.session_tokens(sessions, forget)

        def _abort(self, sessions):  # what the server's abort does: the groups' rows come back, their prompts end
            self.aborted.extend(sessions)
            for uid, tag in list(store.tags.items()):
                aborted = group_session_id(uid) in sessions
                if aborted and tag.get("is_prompt") and tag["status"] in ("pending", "running"):
                    store.set(uid, "finished")

        def _forget(self, sessions):
            self.forgotten.extend(sessions)

        def _rows_per_group(self):  # rollout.n (the servers' config)
            return N

    buffer = Buffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        poll_interval=0.01,
    )
    buffer.ledger = ledger
    return buffer, store


def test_a_failed_group_is_never_kept_and_is_removed_with_the_aborted_ones(monkeypatch):
    from treetune_verl.rollout.session import group_session_id

    statuses = {"a": "failure", "b": "finished", "c": "finished", "d": "running"}  # a failed first
    buffer, store = _buffer(monkeypatch, statuses)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=4)  # target 2
    assert sorted(batch.keys) == [f"{g}_{s}_0" for g in "bc" for s in range(N)]
    assert sorted(buffer.aborted) == sorted(buffer.forgotten) == sorted(group_session_id(g) for g in "ad")
    assert sorted(store.tags) == sorted(batch.keys)  # a, d and their rows gone; b, c's prompts taken by verl
    assert metrics["rollout/aborted_groups"] == 2 and metrics["rollout/failed_groups"] == 1
    # every row of a dropped group, the one that raised (never in TransferQueue) included
    assert metrics["rollout/aborted_rows"] == 2 * N and metrics["rollout/aborted_ratio"] == 4 / 8
    assert metrics["rollout/failed_rows"] == 1 and metrics["rollout/kept_groups"] == 2
    assert metrics["rollout/aborted_tokens"] == 4 * (2 * N - 1)
    assert set(metrics) == set(ABORT_METRICS) and buffer.last_rows == (2 * N, 2 * N)


def test_failures_that_leave_too_few_groups_stop_the_step_by_name(monkeypatch):
    buffer, _ = _buffer(monkeypatch, {"a": "failure", "b": "failure", "c": "failure", "d": "running"})
    with pytest.raises(RuntimeError, match="3 group.* agent loop raised .* target 2 whole groups .*abort_failed_rows"):
        buffer.sample(global_steps=1, partition_id="train", batch_size=4)


def test_failed_rows_aborted_without_over_sampling_train_the_whole_groups_and_drop_the_failed(monkeypatch):
    """Rate 0, ``abort_failed_rows``: the target is every group; a failed one cannot finish whole, so the step trains
    the others and drops it (verl would train it without the row that raised)."""
    statuses = {"a": "failure", "b": "finished", "c": "finished"}
    buffer, store = _buffer(monkeypatch, statuses, over_sample_rate=0.0, abort_failed_rows=True)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=3)
    assert sorted(batch.keys) == [f"{g}_{s}_0" for g in "bc" for s in range(N)]
    assert sorted(store.tags) == sorted(batch.keys)  # a and its row gone
    assert metrics["rollout/aborted_groups"] == metrics["rollout/failed_groups"] == 1
    assert metrics["rollout/kept_groups"] == 2 and metrics["rollout/aborted_rows"] == N
    assert metrics["rollout/failed_rows"] == 1


def test_failed_rows_aborted_train_what_finishes_when_failures_leave_fewer_than_the_target(monkeypatch):
    """Rate 0.5 (target 2 of 4) with 3 failed groups: the step trains the one whole group instead of stopping; with
    every group failed it stops, saying so."""
    statuses = {"a": "failure", "b": "failure", "c": "failure", "d": "finished"}
    buffer, _ = _buffer(monkeypatch, statuses, abort_failed_rows=True)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    assert sorted(batch.keys) == [f"d_{s}_0" for s in range(N)]
    assert metrics["rollout/failed_groups"] == 3 and metrics["rollout/kept_groups"] == 1
    buffer, _ = _buffer(monkeypatch, {"a": "failure", "b": "failure"}, abort_failed_rows=True)
    with pytest.raises(RuntimeError, match="every group of this step failed: 2 group"):
        buffer.sample(global_steps=1, partition_id="train", batch_size=2)


def test_validation_and_rate_zero_are_verls_sample(monkeypatch):
    """A validation batch, and a training batch at rate 0 without failed rows aborted, keep every group, failed ones
    included (verl's behaviour), and abort nothing."""
    for partition, rate in (("val", 0.5), ("train", 0.0)):
        buffer, _ = _buffer(monkeypatch, {"a": "failure", "b": "finished"}, partition=partition, over_sample_rate=rate)
        batch, metrics = buffer.sample(global_steps=1, partition_id=partition, batch_size=2)
        assert buffer.aborted == [] and "rollout/aborted_groups" not in metrics
        assert len(batch.keys) == 2 * N - 1


def test_carry_over_drops_only_the_stale_and_failed_groups_and_leaves_the_others_running(monkeypatch):
    """Step 2, ``max_staleness`` 1: a group dispatched at step 1 would train at step 3 with tokens 2 updates old, so
    of the groups not kept the stale ones go (with a failed one), the fresh one stays running and is counted."""
    from treetune_verl.rollout.session import group_session_id

    # a (step 0) finished first and is kept; b failed; c, d (step 1) running; e (step 2) running
    statuses = {"a": "finished", "b": "failure", "c": "running", "d": "running", "e": "running"}
    buffer, store = _buffer(monkeypatch, statuses, carry_over=True, max_staleness=1)
    store.tags["e"]["global_steps"] = 2
    so_far = {"a": 10, "b": 7, "c": 5, "d": 6, "e": 4}  # each group's tokens at the servers when sample starts
    for group, tokens in so_far.items():
        buffer.ledger.add(group_session_id(group), tokens)
    batch, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=2)  # target 1
    assert sorted(batch.keys) == [f"a_{s}_0" for s in range(N)]
    assert sorted(buffer.aborted) == sorted(group_session_id(g) for g in "bcd")  # stale c, d and failed b
    assert buffer.carried == 1 and "e" in store.tags and store.tags["e"]["status"] == "running"
    assert not any(key.split("_")[0] in "bcd" for key in store.tags), sorted(store.tags)
    assert metrics["rollout/aborted_groups"] == 3 and metrics["rollout/failed_groups"] == 1
    assert metrics["rollout/aborted_rows"] == 3 * N and metrics["rollout/aborted_tokens"] == 4 * (3 * N - 1)
    assert metrics["rollout/carry_over/groups_carried"] == 1
    assert metrics["rollout/carry_over/groups_resumed"] == 1  # a, dispatched at step 0
    assert metrics["rollout/carry_over/staleness/1"] == 3 * N == metrics["rollout/carry_over/tokens_trained"]
    assert metrics["rollout/carry_over/rows_trained"] == N  # a's rows: tokens of step 0, trained at step 2
    # the servers' ledger: the kept and dropped groups resolved at sample, e read after the trainer's pause, when its
    # running turn's 3 partial tokens are back
    assert buffer.ledger.sessions() == 1
    buffer.ledger.add(group_session_id("e"), 3)
    buffer.finish_carry_metrics()
    carry = buffer.take_carry_metrics()
    assert carry == {
        "rollout/carry_over/tokens_discarded": 7 + 5 + 6,  # failed b, stale c and d
        "rollout/carry_over/tokens_discarded_stale": 5 + 6,
        "rollout/carry_over/rows_restarted_stale": 0.0,
        "rollout/carry_over/backlog": 0.0,  # verl 0.9.1 dispatches B - carried fresh prompts: none waits
        "rollout/carry_over/prompt_wait_max": 0.0,
        "rollout/carry_over/prompt_wait_bound": 0.0,
        "rollout/carry_over/tokens_generated": sum(so_far.values()) + 3,
        "rollout/carry_over/tokens_carried": 4 + 3,
        "rollout/carry_over/discarded_share": 18 / 35,
    }
    assert buffer.take_carry_metrics() == {}
    logged = {key for key in (*metrics, *carry) if key.startswith("rollout/carry_over/") and "/staleness/" not in key}
    assert sorted(logged) == sorted(CARRY_OVER_METRICS)  # the keys verl 0.7.1 logs (test_carry_over_on_cpu.py)


def test_the_steps_over_sampling_cost_is_its_wait_after_the_target_and_its_own_cpu(monkeypatch):
    """Issue 49's stand-in on verl 0.9.1: the aborted group comes back ``wait_s`` after the abort (a server cutting
    its requests), and the servers' forget stands in for ``work_s`` of our CPU inside the step. The kept groups have
    finished when ``sample`` starts, so the whole call is the step waiting on over-sampling: its wall (the test's
    clock) is ``timing_s/treetune/over_sampling``, the abort-to-forgotten interval (the stand-in's clock) is
    ``rollout/abort_wait_s``, and ``cpu_s`` is the work, not the 0.01 s polls' sleeps; each within 10 % (20 ms
    floor)."""
    import threading
    import time

    from treetune_tests.treetune_verl.known_times import burn_cpu, close
    from treetune_verl import timing
    from treetune_verl.rollout.session import group_session_id
    from treetune_verl.verl.v0_9_1 import over_sample_sampler

    wait_s, work_s = 1.2, 0.2  # long enough that 10 % of it covers a loaded machine's scheduling
    seconds = timing.FeatureSeconds()
    monkeypatch.setattr(over_sample_sampler, "SECONDS", seconds)
    buffer, store = _buffer(monkeypatch, {"a": "finished", "b": "finished", "c": "running", "d": "running"})
    truth: dict[str, float] = {}

    def abort(sessions):
        truth["abort"] = time.perf_counter()
        buffer.aborted.extend(sessions)
        for uid in "cd":
            assert group_session_id(uid) in sessions
            threading.Timer(wait_s, store.set, (uid, "finished")).start()

    def forget(sessions):
        burn_cpu(work_s)
        truth["forgotten"] = time.perf_counter()

    monkeypatch.setattr(buffer, "_abort", abort)
    monkeypatch.setattr(buffer, "_forget", forget)
    start = time.perf_counter()
    _, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=4)  # target 2: a, b
    wall = time.perf_counter() - start
    metrics |= timing.step_metrics(seconds.take(), step_s=None)

    assert close(metrics["rollout/abort_wait_s"], truth["forgotten"] - truth["abort"])
    assert metrics["rollout/abort_wait_s"] >= wait_s
    assert close(metrics["timing_s/treetune/over_sampling"], wall)
    assert close(metrics["cpu_s/treetune/over_sampling"], work_s)
