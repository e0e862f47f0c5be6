# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Overhead of the override block on a real GRPO step: the e2e run (``test_entropy_e2e.sh``, verl 0.7.1's own
``main_ppo``) with the block (``E2E_BLOCK=1``: our manager, server, workers and loop, full-vocabulary raw entropy)
against stock verl (``E2E_BLOCK=0``: verl's manager and ``single_turn_agent``), everything else identical (seed,
data, model, settings). Both arms run with ``rollout.calculate_log_probs=True`` (the block forces it; the stock arm
sets it), so the ratio isolates the entropy path, not the cost of rollout logprobs.

    python treetune_tests/e2e/bench_e2e_overhead.py                          # 3 pairs x 5 steps, tiny model
    python treetune_tests/e2e/bench_e2e_overhead.py --pairs 6 --steps 4 --out outputs/bench/e2e_overhead.json
    python treetune_tests/e2e/bench_e2e_overhead.py --pairs 12 ... --resume   # add pairs to an earlier call's 6
    python treetune_tests/e2e/bench_e2e_overhead.py --model smollm2 --pairs 10 --steps 4 --concurrent

Runs come in pairs (one run of each arm); the order within a pair is balanced and seeded (ABBA: each block of two
pairs is a shuffled [block-stock, stock-block]), so that a drift of the machine over time hits both arms alike. Each
run has its own workdir (``outputs/bench/e2e-<pair>-<arm>``, the script's output in ``bench_output.txt``) and Ray temp
dir. By default the two runs of a pair run one after the other on the whole machine; a drift of the machine between
them (minutes apart) is then part of the pair's ratio. With ``--concurrent`` they run at the same time, each on one
core of its own (its processes' affinity, inherited by every process of the run), so that whatever else loads the
machine loads both alike; and every ``--swap-s`` seconds (default 2) the two runs trade cores (every thread of each
run's process tree is moved), so that a difference between the two cores is spread over both arms too (with
``--swap-s 0`` on SmolLM2, 2026-11-28, two pairs: generation ratio 1.045 with the block on core 0, 0.970 with the
stock arm there, so core 0 ~3.7 % slower: as large as the effect looked for). A run then has one core: its steps take longer than on two, and
its ratio is the block's overhead in CPU time on one core, where a background cost of the block's own processes
counts in full instead of hiding on an idle core. From every run's ``metrics.jsonl``
the per-step ``timing_s/gen``, ``timing_s/step`` (and ``timing_s/old_log_prob``, ``timing_s/update_actor``,
``timing_s/update_weights`` when logged) are read; step 1 is dropped (it includes the warm-up: first compile, first weight sync, allocator).
Sampling on CPU does not repeat from run to run, so the two runs of a pair generate responses of different lengths
(the same step's mean length differed by up to 2x between arms on SmolLM2, ``gen`` by up to 31 % in a pair). With
``--fixed-length`` (the default) both arms run with ``TREETUNE_BENCH_FIXED_LENGTH=1``: the CPU patch
``verl_cpu.bench_fixed_length`` makes sglang ignore EOS, so every response of both arms is ``response_length`` tokens
long and the arms time the same work in every phase (generation, old log-probs, update). Rewards are meaningless then;
the timing is what is compared. ``--no-fixed-length`` runs the earlier design, where ``gen_per_decode_step``
(``timing_s/gen`` / ``response_length/max``, the decode steps of the batch) compares the same unit of work; the goal is
judged on it in both designs (with fixed lengths it is ``gen`` / the cap); plain ``gen`` is reported beside it.

Reported per phase:

- ``pair``: the ratio block / stock of the two runs' per-run medians, per pair; the median over pairs with a
  distribution-free 95 % CI of the median (order statistics of a Binomial(n, 1/2); needs >= 6 pairs, NaN below).
  The primary figure (independent runs).
- ``step``: the ratio of the same step of the two runs of a pair (same seed and data: the same batch), pooled over
  pairs, with the same CI. More values, but the steps of one run share its process placement and machine state:
  they are not independent, so this CI is optimistic; a secondary figure.

The block arm's in-run attribution (``feature_shares.py``: seconds inside our code per feature, and their share of
``timing_s/step``) is recorded per run too (``block_total_share_of_step``), the noise-free figure the ratio
cross-checks.

Goal (issue acceptance): the block at most 1 % slower in generation (``gen_per_decode_step`` ratio <= 1.01): met when
the pair CI's upper end is <= 1.01, missed when its lower end is > 1.01, not resolved otherwise. Writes JSON (``--out``) after
every pair; ``--budget-s`` starts no pair that the slowest pair so far says would end past the budget. Figures:
treetune_specs/2026-11-23-grpo-e2e.md ("Overhead of the block").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from verl_cpu.hook import BENCH_SWITCH  # noqa: E402  (tools/cpu_shims, on sys.path in the CPU venv)

from treetune_tests.e2e.check_metrics import read_steps, training_steps  # noqa: E402
from treetune_tests.e2e.feature_shares import feature_shares  # noqa: E402
from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95  # noqa: E402

E2E_SCRIPT = REPO_ROOT / "treetune_tests" / "e2e" / "test_entropy_e2e.sh"
PHASES = ("gen", "step", "old_log_prob", "update_actor", "update_weights")
# Sampling on CPU is not reproducible from run to run (the same step of two runs of one arm generates responses of
# different lengths), so the arms' `gen` compare different amounts of work. The batch decodes as many steps as its
# longest response: `gen` per token of the step's longest response compares the same unit of work.
PER_DECODE_STEP = "gen_per_decode_step"
REPORTED = (*PHASES, PER_DECODE_STEP)
ARMS = {"block": "1", "stock": "0"}
GOAL_PHASE, GOAL_RATIO = PER_DECODE_STEP, 1.01


def pair_orders(pairs: int, seed: int) -> list[tuple[str, str]]:
    """ABBA: each block of two pairs is [block-stock, stock-block] in a seeded random order."""
    rng = random.Random(seed)
    orders: list[tuple[str, str]] = []
    while len(orders) < pairs:
        two = [("block", "stock"), ("stock", "block")]
        rng.shuffle(two)
        orders += two
    return orders[:pairs]


def run_env(arm: str, pair: int, args: argparse.Namespace) -> dict[str, str]:
    """The e2e script's environment for one run: the arm's switch, the model, the steps, a workdir and Ray temp dir of
    the run's own."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "E2E_BLOCK": ARMS[arm],
        "E2E_MODEL": args.model,
        "E2E_STEPS": str(args.steps),
        "E2E_WORKDIR": str(workdir(arm, pair, args)),
        "RAY_TMPDIR": f"/tmp/treetune_bench_ray/{pair}-{arm}",  # short: Ray's socket paths have a length limit
    }
    env.pop("E2E_VARIANT", None)
    env.pop("E2E_PROBE", None)
    env.pop(BENCH_SWITCH, None)
    if args.fixed_length:
        env[BENCH_SWITCH] = "1"
    return env


def workdir(arm: str, pair: int, args: argparse.Namespace) -> Path:
    return args.root / f"e2e-{pair}-{arm}"


def start(arm: str, pair: int, args: argparse.Namespace, core: int | None = None) -> subprocess.Popen:
    """The e2e script of one run, started, its output to ``bench_output.txt`` in the run's workdir; on ``core`` only
    (its affinity, inherited by Ray's, verl's and sglang's processes) when given."""
    work = workdir(arm, pair, args)
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "bench_output.txt", "w") as output:  # the child keeps its own descriptor
        return subprocess.Popen(
            ["bash", str(E2E_SCRIPT)],
            env=run_env(arm, pair, args),
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=None if core is None else (lambda: os.sched_setaffinity(0, {core})),
        )


def wait(
    running: dict[str, subprocess.Popen], pair: int, args: argparse.Namespace, cores: dict[str, int] | None = None
) -> dict[str, float]:
    """Each arm's seconds until its run ended, the runs waited for together; the first failure ends the others.
    ``cores``: each arm's core at the start; with ``args.swap_s`` the arms trade cores every ``swap_s`` seconds."""
    began = last_swap = time.monotonic()
    walls: dict[str, float] = {}
    try:
        while len(walls) < len(running):
            for arm, process in running.items():
                if arm in walls or process.poll() is None:
                    continue
                walls[arm] = time.monotonic() - began
                if process.returncode != 0:
                    work = workdir(arm, pair, args)
                    sys.stderr.write((work / "bench_output.txt").read_text()[-8000:])
                    raise SystemExit(
                        f"FAIL: {arm} run of pair {pair} exited with {process.returncode} (log: {work}/train.log)"
                    )
            if cores and args.swap_s and time.monotonic() - last_swap >= args.swap_s:
                cores = dict(zip(cores, reversed(list(cores.values())), strict=True))
                for arm, process in running.items():
                    if arm not in walls:
                        pin_tree(process.pid, cores[arm])
                last_swap = time.monotonic()
            time.sleep(0.2)
    finally:  # the script's watchdog ends its trainer's session
        for process in running.values():
            if process.poll() is None:
                process.terminate()
    return walls


def pin_tree(root: int, core: int) -> None:
    """Every thread of process ``root`` and of its descendants (the run's Ray, verl and sglang processes) onto
    ``core``. A thread's affinity is its own: setting a process's moves its main thread only."""
    import psutil

    try:
        processes = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        threads = []
        with contextlib.suppress(FileNotFoundError):  # the process ended meanwhile
            threads = os.listdir(f"/proc/{process.pid}/task")
        for tid in threads:
            with contextlib.suppress(OSError):  # the thread or process ended meanwhile
                os.sched_setaffinity(int(tid), {core})


def run_pair(order: tuple[str, str], pair: int, args: argparse.Namespace) -> list[dict]:
    """The pair's two runs, back to back in ``order``, or with ``--concurrent`` both at once, the first of ``order``
    on the first of the two cores (so the ABBA orders also balance the cores)."""
    load = os.getloadavg()[0]
    todo = [
        arm for arm in order if not (args.reuse or (args.resume and finished(workdir(arm, pair, args), args.steps)))
    ]
    cores = dict(zip(order, sorted(os.sched_getaffinity(0))[:2], strict=True)) if args.concurrent else {}
    walls: dict[str, float] = {}
    if args.concurrent and todo:
        walls = wait({arm: start(arm, pair, args, cores[arm]) for arm in todo}, pair, args, cores)
    else:
        for arm in todo:
            walls |= wait({arm: start(arm, pair, args)}, pair, args)
    return [read_run(arm, pair, args, walls.get(arm), load, cores.get(arm)) for arm in order]


def read_run(arm: str, pair: int, args: argparse.Namespace, wall: float | None, load: float, core: int | None) -> dict:
    """One finished run's per-step seconds from its ``metrics.jsonl`` (and the block's in-run attribution); ``core``:
    the one it started on (``--concurrent``; with ``--swap-s`` it traded cores from there)."""
    work = workdir(arm, pair, args)
    steps = training_steps(read_steps(work / "metrics.jsonl"))
    # {"step": n, "s": {phase: seconds}} (the phase "step" is verl's timing_s/step)
    timings = [{"step": m["step"], "s": step_seconds(m)} for m in steps]
    run = {"pair": pair, "arm": arm, "workdir": str(work), "wall_s": wall, "load1_before": load, "core": core}
    run["steps"] = timings
    if arm == "block":  # the in-run attribution (treetune_verl/timing.py): the cross-check of the ratio
        run["feature_shares"] = feature_shares(read_steps(work / "metrics.jsonl"))
    shown = ", ".join(f"{p} {statistics.median(kept(run, p).values()):.3f} s" for p in ("gen", "step") if kept(run, p))
    wall_text = "reused" if wall is None else f"{wall:.1f} s wall"
    print(f"  pair {pair} {arm}: {wall_text}, load {load:.2f} before; median after step 1: {shown}", flush=True)
    return run


def finished(work: Path, steps: int) -> bool:
    """Whether ``work`` holds a finished run of ``steps`` training steps (``--resume`` keeps it)."""
    path = work / "metrics.jsonl"
    return path.exists() and len(training_steps(read_steps(path))) >= steps


def step_seconds(metrics: dict) -> dict[str, float]:
    """One step's seconds per phase (verl's ``timing_s/*``) and per decode step of its longest response."""
    seconds = {p: metrics[f"timing_s/{p}"] for p in PHASES if f"timing_s/{p}" in metrics}
    if "gen" in seconds and metrics.get("response_length/max"):
        seconds[PER_DECODE_STEP] = seconds["gen"] / metrics["response_length/max"]
    return seconds


def kept(run: dict, phase: str) -> dict[int, float]:
    """Step -> seconds of one phase, step 1 (warm-up) dropped."""
    return {t["step"]: t["s"][phase] for t in run["steps"] if t["step"] > 1 and phase in t["s"]}


def summarize(runs: list[dict]) -> dict[str, dict]:
    by_pair: dict[int, dict[str, dict]] = {}
    for run in runs:
        by_pair.setdefault(run["pair"], {})[run["arm"]] = run
    summary = {}
    for phase in REPORTED:
        pair_ratios, step_ratios, medians = [], [], {"block": [], "stock": []}
        for arms in by_pair.values():
            b, s = kept(arms["block"], phase), kept(arms["stock"], phase)
            if not b or not s:
                continue
            mb, ms = statistics.median(b.values()), statistics.median(s.values())
            medians["block"].append(mb)
            medians["stock"].append(ms)
            pair_ratios.append(mb / ms)
            step_ratios += [b[k] / s[k] for k in sorted(b.keys() & s.keys())]
        if not pair_ratios:
            continue
        summary[phase] = {
            "median_s_block": statistics.median(medians["block"]),
            "median_s_stock": statistics.median(medians["stock"]),
            "pair": {"ratios": pair_ratios, "median": statistics.median(pair_ratios), "ci95": median_ci95(pair_ratios)},
            "step": {"ratios": step_ratios, "median": statistics.median(step_ratios), "ci95": median_ci95(step_ratios)},
        }
    return summary


def verdict(summary: dict) -> str:
    if GOAL_PHASE not in summary:
        return "no gen timing"
    low, high = summary[GOAL_PHASE]["pair"]["ci95"]
    if high <= GOAL_RATIO:
        return "met"
    if low > GOAL_RATIO:
        return "missed"
    return "not resolved"


def table(summary: dict) -> str:
    lines = [
        f"{'phase':19s} {'block s':>8s} {'stock s':>8s} {'pairs':>5s} {'ratio':>7s} {'pair CI95':>17s} "
        f"{'steps':>5s} {'ratio':>7s} {'step CI95 (optimistic)':>22s}"
    ]
    for phase, s in summary.items():
        p, t = s["pair"], s["step"]
        lines.append(
            f"{phase:19s} {s['median_s_block']:8.3f} {s['median_s_stock']:8.3f} {len(p['ratios']):5d} "
            f"{p['median']:7.4f} [{p['ci95'][0]:7.4f}, {p['ci95'][1]:7.4f}] {len(t['ratios']):5d} "
            f"{t['median']:7.4f} [{t['ci95'][0]:7.4f}, {t['ci95'][1]:7.4f}]"
        )
    return "\n".join(lines)


def _no_nan(value):
    """NaN (a CI with too few values) as null: strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value


def write_report(args: argparse.Namespace, command: str, orders: list, started: float, runs: list[dict]) -> str:
    summary = summarize(runs)
    result = verdict(summary)
    pairs_done = len(
        {run["pair"] for run in runs if run["arm"] == "block"} & {r["pair"] for r in runs if r["arm"] == "stock"}
    )
    report = {
        "command": command,
        "pairs_requested": args.pairs,
        "pairs": pairs_done,
        "steps": args.steps,
        "dropped_steps": [1],
        "model": args.model,
        "fixed_length": args.fixed_length,
        "concurrent": args.concurrent,
        "swap_s": args.swap_s if args.concurrent else None,
        "seed": args.seed,
        "orders": orders[:pairs_done],
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "ended_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load1_before_each_run": [run["load1_before"] for run in runs],
        },
        "goal": {"phase": GOAL_PHASE, "max_ratio": GOAL_RATIO, "verdict": result},
        "summary": summary,
        "block_total_share_of_step": [
            run["feature_shares"].get("total", {}).get("median_share") for run in runs if "feature_shares" in run
        ],
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_no_nan(report), indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="runs of each arm (one pair: one of each)")
    parser.add_argument("--steps", type=int, default=5, help="training steps per run (step 1 is dropped)")
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny", help="E2E_MODEL")
    parser.add_argument(
        "--fixed-length",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every response of both arms ends at the length cap (sglang ignores EOS): the arms time the same work",
    )
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="the two runs of a pair at once, each on a core of its own: a drift of the machine hits both alike",
    )
    parser.add_argument(
        "--swap-s",
        type=float,
        default=2.0,
        help="with --concurrent: the two runs trade cores every this many seconds, so that a difference between the "
        "cores hits both alike (0: each keeps its core)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the order within the pairs")
    parser.add_argument("--root", type=Path, default=REPO_ROOT / "outputs" / "bench", help="parent of the workdirs")
    parser.add_argument(
        "--reuse", action="store_true", help="run nothing: summarize the workdirs of an earlier run with these options"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the finished runs of an earlier call with these options (same --root, --seed) and run the rest: "
        "more pairs over several sittings (each pair is still run back to back)",
    )
    parser.add_argument(
        "--budget-s", type=float, default=None, help="start no pair that would end after this many seconds"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "e2e_overhead.json")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (step 1 is dropped)")
    if args.concurrent and len(os.sched_getaffinity(0)) < 2:
        parser.error("--concurrent needs two cores, one per arm")
    args.root = args.root.resolve()
    args.root.mkdir(parents=True, exist_ok=True)
    orders = pair_orders(args.pairs, args.seed)
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv)
    print(
        f"{args.pairs} pair(s) x {args.steps} steps, model {args.model}, fixed length {args.fixed_length}, "
        f"concurrent {args.concurrent}, orders {orders}",
        flush=True,
    )
    started = time.time()
    runs: list[dict] = []
    pair_seconds: list[float] = []
    for pair, order in enumerate(orders):
        elapsed = time.time() - started
        if args.budget_s is not None and pair_seconds and elapsed + max(pair_seconds) > args.budget_s:
            print(f"budget: {elapsed:.0f} s used, a pair takes up to {max(pair_seconds):.0f} s: stop at {pair} pair(s)")
            break
        pair_start = time.time()
        runs += run_pair(order, pair, args)
        pair_seconds.append(time.time() - pair_start)
        # after every pair: a cut-off run still leaves the pairs it finished
        result = write_report(args, command, orders, started, runs)
    print(table(summarize(runs)))
    print(f"goal {GOAL_PHASE} ratio <= {GOAL_RATIO}: {result} (pair CI; NaN CI below 6 pairs)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
