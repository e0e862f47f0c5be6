# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""How well runs held their rollout entropy in a band: issue 46's acceptance figures, one row per run (arm).

    python -m treetune_verl.control.band_hold controlled=outputs/study/controlled/metrics.jsonl \\
        collapsing=outputs/study/collapsing/metrics.jsonl [--band-from controlled] [--first-step 3] [--json out.json]

The band is the one the controlled arm logged (``control/band_low`` / ``control/band_high``, nats per token) on the
judged steps (a ``target_fraction`` band is fixed after its ``reference_updates`` first updates: 3), or
``--band LOW HIGH``; every arm is judged on it.
Per arm, over the steps from ``--first-step`` on (the controller decides from step 1, but Adam's warm-up and the first
updates are the run's own; issue 46 counts from step 3):

- ``band_hold``: the share of steps whose rollout entropy (sampling-time, the step's own batch, nats per token: the
  quantity the user sees) lies in the band;
- ``overshoot``: the largest distance outside the band over those steps (nats; 0 when always inside);
- ``start`` / ``lowest`` / ``lowest_share``: the rollout entropy at the first step, its lowest, and their ratio (a
  collapse below 10 % of the start is issue 46's stock baseline);
- ``final_reward``: the mean reward (``critic/score/mean``) of the last ``--last`` steps (5: one step's reward over 16
  responses is noisy);
- ``control_cost_ratio``: the median of ``control/cost_ratio`` (the controller's seconds over the update's, the
  forecast's included), NaN for arms without the controller; ``probe_cost_ratio``: the median of ``probe/cost_ratio``
  (the forecast's seconds, the controller's inside them, over verl's own update's; NaN without the forecast). Not
  ``timing_s/probe / timing_s/update_actor``: verl's ``update_actor`` timer contains the forecast, so that share
  reads 0.63 where the forecast and the controller take 1.73x verl's own update (seed 7, current stack);
- ``length_start`` / ``final_length``: the mean response length (tokens) at the first step and over the last
  ``--last`` steps (answers shortened under control on the first SmolLM2 runs).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from treetune_verl.forecast.calibration import Step, read_run

FIRST_STEP = 3
LAST_STEPS = 5


@dataclass(frozen=True)
class BandHold:
    """One run judged on one band (module docstring)."""

    steps: int  # judged, from first_step on
    band_hold: float
    overshoot: float  # nats per token
    start: float
    lowest: float
    lowest_share: float
    final_reward: float
    control_cost_ratio: float
    probe_cost_ratio: float
    length_start: float
    final_length: float


def logged_band(run: Sequence[Step], first_step: int = FIRST_STEP) -> tuple[float, float]:
    """The band a controlled run logged on its steps from ``first_step`` on.

    Raises:
        ValueError: the run logged no band there, or more than one (a band that moved cannot judge the others).
    """
    judged = [s for s in run if s.step >= first_step]
    bands = {(s.band_low, s.band_high) for s in judged if math.isfinite(s.band_low) and math.isfinite(s.band_high)}
    if len(bands) != 1:
        raise ValueError(f"expected the one band of a controlled run, found {sorted(bands) or 'none'}")
    return bands.pop()


def band_hold(
    run: Sequence[Step], low: float, high: float, first_step: int = FIRST_STEP, last: int = LAST_STEPS
) -> BandHold:
    """``run`` judged on the band ``[low, high]`` (module docstring).

    Raises:
        ValueError: an empty band, no step from ``first_step`` on, or a judged step without its rollout entropy (a
            missing entropy is not one inside or outside the band).
    """
    if not low < high:
        raise ValueError(f"the band [{low}, {high}] is empty")
    judged = [s for s in run if s.step >= first_step]
    if not judged:
        raise ValueError(f"no step from step {first_step} on (steps {[s.step for s in run]})")
    missing = [s.step for s in judged if not math.isfinite(s.rollout_entropy)]
    if missing:
        raise ValueError(f"steps {missing} logged no rollout entropy")
    inside = [low <= s.rollout_entropy <= high for s in judged]
    outside = [max(low - s.rollout_entropy, s.rollout_entropy - high, 0.0) for s in judged]
    entropies = [s.rollout_entropy for s in run if math.isfinite(s.rollout_entropy)]
    rewards = [s.reward for s in run[-last:] if math.isfinite(s.reward)]
    costs = [s.control_cost_ratio for s in run if math.isfinite(s.control_cost_ratio)]
    probe = [s.probe_cost_ratio for s in run if math.isfinite(s.probe_cost_ratio)]
    lengths = [s.response_length for s in run[-last:] if math.isfinite(s.response_length)]
    return BandHold(
        steps=len(judged),
        band_hold=sum(inside) / len(judged),
        overshoot=max(outside),
        start=entropies[0],
        lowest=min(entropies),
        lowest_share=min(entropies) / entropies[0],
        final_reward=statistics.fmean(rewards) if rewards else math.nan,
        control_cost_ratio=statistics.median(costs) if costs else math.nan,
        probe_cost_ratio=statistics.median(probe) if probe else math.nan,
        length_start=run[0].response_length,
        final_length=statistics.fmean(lengths) if lengths else math.nan,
    )


def markdown_table(rows: dict[str, BandHold], low: float, high: float, first_step: int) -> str:
    """The README's table: one row per arm."""
    lines = [
        f"| arm | band [{low:.2f}, {high:.2f}] held, steps ≥ {first_step} | overshoot (nats) | rollout entropy start → "
        "lowest | final reward | response length start → final | controller / update (forecast included) | "
        "forecast + controller / verl's own update |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in rows.items():
        cost, probe = (f"{v:.2f}" if math.isfinite(v) else "-" for v in (r.control_cost_ratio, r.probe_cost_ratio))
        lines.append(
            f"| {arm} | {r.band_hold:.0%} ({round(r.band_hold * r.steps)}/{r.steps}) | {r.overshoot:.2f} | "
            f"{r.start:.2f} → {r.lowest:.3f} ({r.lowest_share:.0%}) | {r.final_reward:.3f} | "
            f"{r.length_start:.1f} → {r.final_length:.1f} | {cost} | {probe} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="arm=path/to/metrics.jsonl")
    parser.add_argument("--band-from", help="the arm whose logged band judges every arm (default: the only one)")
    parser.add_argument("--band", nargs=2, type=float, metavar=("LOW", "HIGH"), help="a band instead (nats)")
    parser.add_argument("--first-step", type=int, default=FIRST_STEP)
    parser.add_argument("--last", type=int, default=LAST_STEPS, help="steps of the final reward's mean")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    runs = {}
    for spec in args.runs:
        arm, sep, path = spec.partition("=")
        if not sep or not arm or not path:
            parser.error(f"expected arm=path/to/metrics.jsonl, got {spec!r}")
        runs[arm] = read_run(path)
    if args.band is not None:
        low, high = args.band
    else:
        controlled = [arm for arm, run in runs.items() if any(math.isfinite(s.band_low) for s in run)]
        source = args.band_from or (controlled[0] if len(controlled) == 1 else None)
        if source not in runs:
            parser.error(f"--band-from: name one arm of {sorted(runs)} (arms with a band: {controlled}), or --band")
        low, high = logged_band(runs[source], args.first_step)
    rows = {arm: band_hold(run, low, high, args.first_step, args.last) for arm, run in runs.items()}
    print(markdown_table(rows, low, high, args.first_step))
    if args.json is not None:
        band = {"low": low, "high": high, "first_step": args.first_step}
        args.json.write_text(json.dumps({"band": band, "arms": {a: asdict(r) for a, r in rows.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
