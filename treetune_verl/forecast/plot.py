# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Forecast vs realised entropy change over training steps, from verl's ``metrics.jsonl``, as a PNG (matplotlib, Agg).

verl's file logger (``VERL_FILE_LOGGER_PATH``) writes one JSON object per step, ``{"step": n, "data": {...}}``; the
probed steps carry ``probe/deltaH1/<estimator>`` (with ``probe/deltaH1_se/<estimator>``, drawn as ±1 standard error)
and ``probe/deltaH_realised`` (with ``probe/deltaH_realised_se``), and the early warning's ``probe/warning/*``
(``early_warning.py``): the lower panel draws the entropy, its floor and the projection from the last forecast at the
forecast rate; a warning's forecast is marked in both panels.

    python -m treetune_verl.forecast.plot outputs/e2e/metrics.jsonl            # writes outputs/e2e/entropy_forecast.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from treetune_verl.forecast.settings import ESTIMATORS

REALISED = "probe/deltaH_realised"
PLOT_NAME = "entropy_forecast.png"
ENTROPY, RATE, FLOOR = "probe/warning/entropy", "probe/warning/rate", "probe/warning/floor"
STEPS_TO_FLOOR, COLLAPSE, DISAGREE = "probe/warning/steps_to_floor", "probe/warning/collapse", "probe/warning/disagree"


def read_forecasts(metrics_jsonl: Path) -> list[dict[str, float]]:
    """The probed steps, in order: ``{"step": n, **the step's probe/* metrics}``."""
    steps = []
    for line in Path(metrics_jsonl).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        data = record.get("data", {})
        if REALISED in data:
            steps.append({"step": record["step"], **{k: v for k, v in data.items() if k.startswith("probe/")}})
    return steps


def plot_forecast(metrics_jsonl: Path, out_png: Path | None = None) -> Path:
    """Write the plot next to ``metrics_jsonl`` (or to ``out_png``); returns its path.

    Raises:
        ValueError: no probed step in the file.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = read_forecasts(metrics_jsonl)
    if not steps:
        raise ValueError(f"{metrics_jsonl}: no step with {REALISED} (was the forecast block on?)")
    out = Path(out_png) if out_png is not None else Path(metrics_jsonl).with_name(PLOT_NAME)
    warned = [s for s in steps if ENTROPY in s]
    fig, axes = plt.subplots(2 if warned else 1, 1, figsize=(7, 7 if warned else 4), squeeze=False)
    ax = axes[0][0]
    x = [s["step"] for s in steps]
    for offset, estimator in zip((-0.08, 0.08), ESTIMATORS, strict=True):
        key = f"probe/deltaH1/{estimator}"
        points = [(s["step"] + offset, s[key], s.get(f"probe/deltaH1_se/{estimator}", 0.0)) for s in steps if key in s]
        if points:
            px, py, pe = zip(*points, strict=True)
            ax.errorbar(px, py, yerr=pe, fmt="o", capsize=3, label=f"forecast ΔH₁ ({estimator}) ± 1 s.e.")
    realised_se = [s.get(REALISED + "_se", 0.0) for s in steps]
    ax.errorbar(
        x,
        [s[REALISED] for s in steps],
        yerr=realised_se,
        fmt="k*-",
        markersize=10,
        capsize=3,
        label="realised ΔH (importance-weighted) ± 1 s.e.",
    )
    ax.axhline(0.0, color="grey", linewidth=0.8)
    _mark_warnings(ax, steps)
    ax.set_ylabel("entropy change (nats per budget token)")
    ax.set_title("Entropy forecast vs realised change per actor update")
    ax.legend(fontsize=8)
    if warned:
        _plot_projection(axes[1][0], warned)
    for row in axes:
        row[0].xaxis.set_major_locator(MaxNLocator(integer=True))
        row[0].set_xlabel("training step")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _mark_warnings(ax, steps: list[dict[str, float]]) -> None:
    """A vertical band at each forecast that warned: collapse (red) or disagreement (orange)."""
    for key, color, label in ((COLLAPSE, "red", "collapse warning"), (DISAGREE, "orange", "disagreement warning")):
        for i, step in enumerate(s["step"] for s in steps if s.get(key, 0.0) >= 1.0):
            ax.axvspan(step - 0.3, step + 0.3, color=color, alpha=0.15, label=label if i == 0 else None)


def _plot_projection(ax, steps: list[dict[str, float]]) -> None:
    """The entropy at each forecast, the floor, and the last forecast's projection at its rate when it falls: to the
    floor, drawn over at most three times the steps plotted so far."""
    x, h = [s["step"] for s in steps], [s[ENTROPY] for s in steps]
    ax.plot(x, h, "k.-", label="entropy after the update (nats per budget token)")
    last, floor = steps[-1], steps[-1].get(FLOOR, 0.0)
    ax.axhline(floor, color="red", linewidth=0.8, linestyle=":", label=f"floor {floor:g}")
    rate, to_floor = last.get(RATE, 0.0), last.get(STEPS_TO_FLOOR, 0.0)
    if rate < 0:
        span = min(to_floor, 3.0 * max(x[-1] - x[0] + 1, 1))
        ax.plot(
            [last["step"], last["step"] + span],
            [last[ENTROPY], last[ENTROPY] + rate * span],
            "r--",
            label=f"projection at the forecast rate: the floor in {to_floor:.0f} steps",
        )
    _mark_warnings(ax, steps)
    ax.set_ylabel("entropy (nats per budget token)")
    ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path, help="verl's metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help=f"PNG path (default: {PLOT_NAME} next to the metrics)")
    args = parser.parse_args(argv)
    print(plot_forecast(args.metrics, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
