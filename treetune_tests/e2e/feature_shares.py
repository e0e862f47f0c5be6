# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Each feature's cost in a GRPO step, from one run's ``metrics.jsonl`` (the in-run attribution of
``treetune_verl/timing.py``: the wall seconds the step waited on our code and our CPU seconds, measured in the run, so
run-to-run noise does not enter).

    make e2e E2E_STEPS=4 E2E_OVER_SAMPLE=0.25 E2E_PG_TOKEN_QUANTILE=0.2     # SmolLM2, the features on
    python -m treetune_tests.e2e.feature_shares outputs/e2e/metrics.jsonl --out outputs/bench/feature_shares.json

Per feature: the median over the training steps after step 1 (its warm-up) of ``timing_s/treetune/<feature>`` (the
step's wait) and of its share of ``timing_s/step``, with the range over those steps, and the median of
``cpu_s/treetune/<feature>`` (our CPU seconds); the same for the total and the step itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from treetune_tests.e2e.check_metrics import read_steps, training_steps

PREFIX = "timing_s/treetune/"
CPU_PREFIX = "cpu_s/treetune/"
STEP = "timing_s/step"


def feature_shares(steps: list[dict]) -> dict[str, dict[str, float]]:
    """``{feature | "total": {"median_s", "min_s", "max_s", "median_share", "median_cpu_s"}}`` plus ``"step"``
    (seconds only), over the training steps after the first (``median_cpu_s`` only where the run logged CPU seconds).
    """
    kept = [m for m in training_steps(steps) if m["step"] > 1 and STEP in m]
    if not kept:
        raise ValueError("no training step after step 1 with timing_s/step: run at least 2 steps")
    features = sorted({key.removeprefix(PREFIX) for m in kept for key in m if key.startswith(PREFIX)})
    result = {}
    for feature in features:
        seconds = [m.get(PREFIX + feature, 0.0) for m in kept]
        shares = [s / m[STEP] for s, m in zip(seconds, kept, strict=True)]
        result[feature] = {
            "median_s": statistics.median(seconds),
            "min_s": min(seconds),
            "max_s": max(seconds),
            "median_share": statistics.median(shares),
        }
        if any(CPU_PREFIX + feature in m for m in kept):
            result[feature]["median_cpu_s"] = statistics.median(m.get(CPU_PREFIX + feature, 0.0) for m in kept)
    step_s = [m[STEP] for m in kept]
    result["step"] = {"median_s": statistics.median(step_s), "min_s": min(step_s), "max_s": max(step_s)}
    return result


def table(shares: dict[str, dict[str, float]]) -> str:
    lines = [f"{'feature':16s} {'median s':>10s} {'range s':>21s} {'share of step':>14s} {'CPU s':>8s}"]
    for feature, s in shares.items():
        share = f"{100 * s['median_share']:13.3f}%" if "median_share" in s else f"{'':14s}"
        cpu = f"{s['median_cpu_s']:8.4f}" if "median_cpu_s" in s else ""
        lines.append(f"{feature:16s} {s['median_s']:10.4f} [{s['min_s']:8.4f}, {s['max_s']:8.4f}] {share} {cpu}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl (verl's file logger)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    shares = feature_shares(read_steps(args.metrics))
    print(table(shares))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"metrics": str(args.metrics), "shares": shares}, indent=1))


if __name__ == "__main__":
    main()
