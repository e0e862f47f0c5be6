# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``treetune_verl/timing.py``'s cost definition against stand-ins whose true times are known.

A stand-in's working time is CPU it burns (``known_times.burn_cpu``), its waiting time a sleep or an await; the
reference for wall time is ``time.perf_counter`` read by the test around the whole stand-in, never the module's own
figures. Tolerance ±10 % with a 20 ms floor (``known_times.close``, issue 49).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
import time

import pytest

from treetune_tests.treetune_verl.known_times import burn_cpu, close
from treetune_verl import timing
from treetune_verl.timing import OVER_SAMPLING, ROLLOUT_ENTROPY, STEERING, AwaitInTimedBlock, FeatureSeconds


def test_synchronous_blocks_count_their_wall_as_critical_and_their_cpu_as_work():
    seconds = FeatureSeconds()
    start = time.perf_counter()
    with seconds.timed(OVER_SAMPLING):
        burn_cpu(0.3)
        time.sleep(0.4)  # a blocking wait on the step's path (a ray.get, a poll): critical, not work
    seconds.waited(OVER_SAMPLING, 0.25)  # an interval its caller measured
    wall = time.perf_counter() - start
    cost = seconds.take()
    assert close(cost.critical()[OVER_SAMPLING], wall + 0.25)
    assert close(cost.cpu[OVER_SAMPLING], 0.3)
    assert seconds.take().critical() == {} and seconds.take().cpu == {}  # taken: the next step starts at zero


async def test_concurrent_rows_waiting_outside_their_blocks_count_their_work_once_and_no_waiting():
    """The old definition timed each row's awaited wait: 8 rows parked 0.5 s gave 4 s of a 0.5 s wait."""
    seconds = FeatureSeconds()

    async def row() -> None:
        with seconds.timed(OVER_SAMPLING):
            burn_cpu(0.02)
        await asyncio.sleep(0.5)  # waiting for its group: not work, and not in a block
        with seconds.timed(OVER_SAMPLING):
            burn_cpu(0.02)

    start = time.perf_counter()
    await asyncio.gather(*(row() for _ in range(8)))
    wall = time.perf_counter() - start
    cost = seconds.take()
    assert close(cost.cpu[OVER_SAMPLING], 8 * 0.04)
    # the blocks' own wall (one thread: they run one at a time, 0.32 s of CPU on an idle machine), never the 8 x 0.5 s
    # of parked rows the old definition counted
    assert cost.critical()[OVER_SAMPLING] <= wall and cost.critical()[OVER_SAMPLING] < 8 * 0.5 / 2


async def test_an_await_inside_a_timed_block_is_caught_when_another_task_enters_one():
    seconds = FeatureSeconds()
    entered = asyncio.Event()

    async def awaits_inside() -> None:
        with seconds.timed(OVER_SAMPLING):
            entered.set()
            await asyncio.sleep(0.05)

    async def other_row() -> None:
        await entered.wait()
        with seconds.timed(ROLLOUT_ENTROPY):
            pass

    with pytest.raises(AwaitInTimedBlock, match="'rollout_entropy' was entered while one of 'over_sampling' is open"):
        await asyncio.gather(awaits_inside(), other_row())


def test_nested_blocks_count_exclusively_so_the_total_is_counted_once():
    seconds = FeatureSeconds()
    with seconds.timed(OVER_SAMPLING):
        burn_cpu(0.1)
        with seconds.timed(STEERING):
            burn_cpu(0.2)
    cost = seconds.take()
    assert close(cost.cpu[OVER_SAMPLING], 0.1) and close(cost.cpu[STEERING], 0.2)
    assert close(sum(cost.cpu.values()), 0.3)


def test_threads_of_one_process_add_their_work():
    seconds = FeatureSeconds()

    def work() -> None:
        with seconds.timed(OVER_SAMPLING):
            burn_cpu(0.15)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert close(seconds.take().cpu[OVER_SAMPLING], 0.3)


def _worker_process_cpu(burn_s: float) -> dict[str, float]:
    """An agent-loop worker's batch: its work in its own process, taken as it sends it with the rows."""
    with timing.SECONDS.timed(OVER_SAMPLING):
        burn_cpu(burn_s)
    return timing.SECONDS.take().cpu


def test_work_of_other_processes_adds_to_the_trainers_and_their_wall_is_not_critical():
    seconds = FeatureSeconds()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        shipped = list(pool.map(_worker_process_cpu, [0.2, 0.3]))
    for cpu in shipped:
        seconds.add_cpu(cpu)
    start = time.perf_counter()
    with seconds.timed(OVER_SAMPLING):
        burn_cpu(0.1)
    own_wall = time.perf_counter() - start
    cost = seconds.take()
    assert close(cost.cpu[OVER_SAMPLING], 0.6)
    # only the trainer's own block (the test's clock around it, whatever the machine's load): the workers' overlapped
    # generation and are not on the step's path
    assert close(cost.critical()[OVER_SAMPLING], own_wall)


def test_step_metrics_name_both_figures_per_feature_and_the_critical_share():
    cost = timing.StepCost(wall={STEERING: 0.5}, waited={OVER_SAMPLING: 1.5}, cpu={STEERING: 0.4, OVER_SAMPLING: 0.1})
    metrics = timing.step_metrics(cost, step_s=10.0)
    assert metrics["timing_s/treetune/over_sampling"] == 1.5 and metrics["timing_s/treetune/steering"] == 0.5
    assert metrics["timing_s/treetune/rollout_entropy"] == 0.0 and metrics["timing_s/treetune/total"] == 2.0
    assert metrics["cpu_s/treetune/over_sampling"] == 0.1 and metrics["cpu_s/treetune/total"] == pytest.approx(0.5)
    assert metrics["treetune/share_of_step"] == pytest.approx(0.2)
    assert set(metrics) == {
        f"{prefix}/treetune/{name}" for prefix in ("timing_s", "cpu_s") for name in (*timing.FEATURES, "total")
    } | {"treetune/share_of_step"}


def test_an_unknown_feature_or_a_negative_wait_is_refused():
    seconds = FeatureSeconds()
    with pytest.raises(ValueError, match="unknown feature 'over_sample'"), seconds.timed("over_sample"):
        pass
    with pytest.raises(ValueError, match="unknown feature"):
        seconds.add_cpu({"steer": 1.0})
    with pytest.raises(ValueError, match="a wait is not negative"):
        seconds.waited(OVER_SAMPLING, -0.1)
