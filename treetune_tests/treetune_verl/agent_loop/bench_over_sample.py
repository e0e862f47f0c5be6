# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling with abort, measured: wall time of one rollout step at ``over_sample_rate`` 0 vs 0.25.

The real rollout path of the over-sampling test (``test_over_sample_standalone_on_cpu.py``): real Ray, our manager in verl's
standalone mode, a real sglang CPU Engine behind ``EntropySGLangHttpServer``, two agent-loop workers. Every row is a
``fixed_length_agent`` row generating exactly ``N`` tokens, ``N`` drawn per row from a heavy-tailed (Pareto) law
capped at ``response_length``: most rows are short, a few run long, which is what over-sampling is for. Each pair
draws one batch of lengths (seeded) and runs it once per arm, in ABBA order; the manager's rate is switched between
the two runs of a pair (the same servers, workers and counter serve both arms). Reported: the median of the per-pair
ratios ``seconds(0.25) / seconds(0)`` with a distribution-free 95 % interval, the median seconds of each arm, and
the rows each arm returns for training (all of them at 0; ``ceil(0.75 * batch)`` at 0.25). One warm-up step per arm
is not counted (the engine's first batches).

    python treetune_tests/treetune_verl/agent_loop/bench_over_sample.py --pairs 8 --out outputs/bench/over_sample.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import open_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run as a script from anywhere

from treetune_tests.treetune_verl.agent_loop.fakes import make_batch  # noqa: E402
from treetune_tests.treetune_verl.agent_loop.standalone import (  # noqa: E402
    REPO_ROOT,
    model_with_short_turns,
    ray_session,
)
from treetune_tests.treetune_verl.agent_loop.test_over_sample_standalone_on_cpu import _over_sample_config  # noqa: E402
from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95  # noqa: E402
from treetune_verl.batch_keys import ROLLOUT_ABORTED_KEY  # noqa: E402

RATES = {"rate0": 0.0, "rate0.25": 0.25}


def heavy_tailed_lengths(batch: int, rng: random.Random, alpha: float, minimum: int, cap: int) -> list[int]:
    """``batch`` response lengths from a Pareto(alpha) law with scale ``minimum``, capped at ``cap``."""
    return [min(cap, int(minimum * rng.paretovariate(alpha))) for _ in range(batch)]


def abba(pairs: int, seed: int) -> list[tuple[str, str]]:
    rng, orders = random.Random(seed), []
    while len(orders) < pairs:
        two = [("rate0", "rate0.25"), ("rate0.25", "rate0")]
        rng.shuffle(two)
        orders += two
    return orders[:pairs]


def summarize(runs: list[dict]) -> dict:
    """Per-pair ratios (rate 0.25 over rate 0) of wall time and of kept rows per second, as medians with a
    distribution-free 95 % interval; each arm's median seconds, kept rows and kept tokens."""
    by_pair = {(run["pair"], run["arm"]): run for run in runs}
    pairs = sorted({pair for pair, _ in by_pair if (pair, "rate0") in by_pair and (pair, "rate0.25") in by_pair})
    over, base = [by_pair[(p, "rate0.25")] for p in pairs], [by_pair[(p, "rate0")] for p in pairs]
    seconds = [o["seconds"] / b["seconds"] for o, b in zip(over, base, strict=True)]
    rows_per_s = [
        (o["rows_kept"] / o["seconds"]) / (b["rows_kept"] / b["seconds"]) for o, b in zip(over, base, strict=True)
    ]
    summary = {"pairs": len(pairs)}
    for name, ratios in (("ratio_seconds", seconds), ("ratio_kept_rows_per_second", rows_per_s)):
        summary[name] = {"median": statistics.median(ratios), "ci95": list(median_ci95(ratios))}
    for arm in RATES:
        arm_runs = [r for r in runs if r["arm"] == arm]
        summary[arm] = {
            "median_seconds": statistics.median(r["seconds"] for r in arm_runs),
            "rows_kept": sorted({r["rows_kept"] for r in arm_runs}),
            "median_tokens_kept": statistics.median(r["tokens_kept"] for r in arm_runs),
        }
    return summary


def describe(summary: dict) -> str:
    time, rate = summary["ratio_seconds"], summary["ratio_kept_rows_per_second"]
    return (
        f"over_sample_rate 0.25 vs 0 over {summary['pairs']} pairs: rollout step wall time x{time['median']:.3f} "
        f"[{time['ci95'][0]:.3f}, {time['ci95'][1]:.3f}], kept rows per second x{rate['median']:.3f} "
        f"[{rate['ci95'][0]:.3f}, {rate['ci95'][1]:.3f}]; rate0 {summary['rate0']['median_seconds']:.2f}s "
        f"({summary['rate0']['rows_kept']} rows), rate0.25 {summary['rate0.25']['median_seconds']:.2f}s "
        f"({summary['rate0.25']['rows_kept']} rows)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--alpha", type=float, default=1.0, help="Pareto tail index (smaller: heavier tail)")
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=768)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "over_sample.json")
    args = parser.parse_args(argv)

    from treetune_tests.tiny_model import build_tiny_qwen2
    from treetune_verl.agent_loop import EntropyAgentLoopManager
    from treetune_verl.model_cache import models_dir

    work = Path(tempfile.mkdtemp(prefix="bench_over_sample_"))
    model = model_with_short_turns(build_tiny_qwen2(models_dir() / "tiny-qwen2-seed0", seed=0), work / "m")
    config = _over_sample_config(model, work / "cfg")
    with open_dict(config):
        config.data.max_response_length = args.response_length  # the rollout's response_length follows it
    started, runs = time.time(), []
    orders = abba(args.pairs, args.seed)
    with pytest.MonkeyPatch.context() as env, ray_session(env):
        manager = EntropyAgentLoopManager.create(config)

        def step(arm: str, lengths: list[int]) -> dict:
            manager._over_sample_rate = RATES[arm]  # bench only: one set of servers serves both arms
            batch = make_batch([f"tokens={n}" for n in lengths], ["fixed_length_agent"] * len(lengths))
            # every row its own group (rollout.n = 1): the target counts rows
            batch.non_tensor_batch["uid"] = np.array([str(row) for row in range(len(lengths))], dtype=object)
            t0 = time.perf_counter()
            out = manager.generate_sequences(batch)
            seconds = time.perf_counter() - t0
            kept = int((~out.batch[ROLLOUT_ABORTED_KEY]).sum())
            tokens = int(out.batch["response_mask"].sum())
            return {
                "arm": arm,
                "seconds": seconds,
                "rows_kept": kept,
                "tokens_kept": tokens,
                "load1": os.getloadavg()[0],
            }

        rng = random.Random(args.seed)
        for arm in RATES:  # warm-up, not counted: the engine's first batches
            step(arm, heavy_tailed_lengths(args.batch, rng, args.alpha, args.min_tokens, args.response_length))
        for pair, order in enumerate(orders):
            lengths = heavy_tailed_lengths(args.batch, rng, args.alpha, args.min_tokens, args.response_length)
            for arm in order:
                runs.append({"pair": pair, "lengths": lengths, **step(arm, lengths)})
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "lengths"}), flush=True)

    summary = summarize(runs)
    report = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "orders": orders,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "ended_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{describe(summary)} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
