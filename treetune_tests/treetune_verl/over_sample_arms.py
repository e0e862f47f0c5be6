# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What both stacks' over-sampling benches share: the arms, the heavy-tailed lengths, the per-block summary and the
JSON report (``agent_loop/bench_over_sample.py`` on verl 0.7.1, ``verl/v0_9_1/bench_over_sample_v0_9_1.py``)."""

from __future__ import annotations

import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
from argparse import ArgumentParser, Namespace

import torch

from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95

__all__ = ["ARMS", "add_arm_arguments", "describe", "heavy_tailed_lengths", "run_record", "summarize", "write_report"]

# stock: rate 0; abort_drop: rows counted (groups may be cut); groups: whole groups; carry: whole groups + carry-over
ARMS = ("stock", "abort_drop", "groups", "carry")
BASES = ("stock", "abort_drop")  # the arms each other arm's trained tokens per second is compared with


def add_arm_arguments(parser: ArgumentParser, steps: int) -> None:
    """The benches' shared options: blocks, the run (``steps`` per run by default), the prompts and their lengths."""
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=steps, help="steps per run")
    parser.add_argument("--groups", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="rows per prompt (rollout.n)")
    parser.add_argument("--rate", type=float, default=0.25, help="over_sample_rate of the three over-sampling arms")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=1.0, help="Pareto tail index (smaller: heavier tail)")
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=768)
    parser.add_argument("--seed", type=int, default=0)


def heavy_tailed_lengths(count: int, rng: random.Random, alpha: float, minimum: int, cap: int) -> list[int]:
    """``count`` response lengths from a Pareto(alpha) law with scale ``minimum``, capped at ``cap``."""
    return [min(cap, int(minimum * rng.paretovariate(alpha))) for _ in range(count)]


def run_record(
    arm: str, seconds: float, trained: float, generated: float, discarded: float, carried_at_end: float, **more: float
) -> dict:
    """One run's figures as the summary reads them (tokens; ``carried_at_end``: still carried after the last step)."""
    return {
        "arm": arm,
        "seconds": seconds,
        "trained_tokens": trained,
        "generated_tokens": generated,
        "discarded_tokens": discarded,
        "carried_at_end_tokens": carried_at_end,
        "discarded_share": discarded / generated if generated else 0.0,
        **more,
        "load1": os.getloadavg()[0],
    }


def summarize(runs: list[dict]) -> dict:
    """Per block, each arm's trained tokens per second over ``stock``'s and ``abort_drop``'s (medians, 95 % CI);
    each arm's median seconds, trained tokens and discarded share. A run: ``block``, ``arm``, ``seconds``,
    ``trained_tokens``, ``discarded_share``."""
    by_block = {(run["block"], run["arm"]): run for run in runs}
    blocks = sorted({block for block, _ in by_block if all((block, arm) in by_block for arm in ARMS)})

    def rate(block: int, arm: str) -> float:
        run = by_block[(block, arm)]
        return run["trained_tokens"] / run["seconds"]

    summary: dict = {"blocks": len(blocks)}
    for arm in ARMS:
        arm_runs = [by_block[(block, arm)] for block in blocks]
        summary[arm] = {
            "median_seconds": statistics.median(r["seconds"] for r in arm_runs),
            "median_trained_tokens": statistics.median(r["trained_tokens"] for r in arm_runs),
            "median_trained_tokens_per_s": statistics.median(rate(b, arm) for b in blocks),
            "median_discarded_share": statistics.median(r["discarded_share"] for r in arm_runs),
            "pooled_discarded_share": sum(r["discarded_tokens"] for r in arm_runs)
            / max(1, sum(r["generated_tokens"] for r in arm_runs)),
        }
        for base in BASES:
            if arm != base:
                ratios = [rate(block, arm) / rate(block, base) for block in blocks]
                summary[arm][f"trained_tokens_per_s_vs_{base}"] = {
                    "median": statistics.median(ratios),
                    "ci95": list(median_ci95(ratios)),
                }
    return summary


def describe(summary: dict) -> str:
    lines = [f"{summary['blocks']} blocks:"]
    for arm in ARMS:
        s = summary[arm]
        line = (
            f"  {arm:10s} {s['median_seconds']:6.2f} s, {s['median_trained_tokens_per_s']:7.1f} trained tokens/s, "
            f"discarded {100 * s['median_discarded_share']:5.1f} % (pooled {100 * s['pooled_discarded_share']:.1f} %)"
        )
        for base in BASES:
            ratio = s.get(f"trained_tokens_per_s_vs_{base}")
            if ratio is not None:
                line += f"; vs {base} x{ratio['median']:.3f} [{ratio['ci95'][0]:.3f}, {ratio['ci95'][1]:.3f}]"
        lines.append(line)
    return "\n".join(lines)


def write_report(args: Namespace, runs: list[dict], started: float, stack: dict[str, str]) -> dict:
    """The JSON report at ``args.out`` (command, arguments, machine, ``stack`` versions, summary, every run); printed."""
    summary = summarize(runs)
    report = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            **stack,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "ended_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{describe(summary)}\n-> {args.out}")
    return report
