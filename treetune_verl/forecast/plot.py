# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""One run's forecast as a PNG (matplotlib, Agg), from verl's ``metrics.jsonl``: the forecast of E's token entropy
change vs the realised change per step (±2 standard errors), and the entropy with the collapse warnings over it
(``study_report.draw_forecast`` / ``draw_entropy``; the study's report draws the same panels for several runs).

    python -m treetune_verl.forecast.plot outputs/e2e/metrics.jsonl            # writes outputs/e2e/entropy_forecast.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from treetune_verl.forecast.calibration import read_run
from treetune_verl.forecast.study_report import draw_entropy, draw_forecast

PLOT_NAME = "entropy_forecast.png"


def plot_forecast(metrics_jsonl: Path, out_png: Path | None = None) -> Path:
    """Write the plot next to ``metrics_jsonl`` (or to ``out_png``); returns its path.

    Raises:
        ValueError: no forecast step in the file (the forecast block off, or a run of an older version).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    run = read_run(metrics_jsonl)
    if not any(s.forecast_step for s in run):
        raise ValueError(f"{metrics_jsonl}: no step with probe/token/deltaH1 (was the forecast block on?)")
    out = Path(out_png) if out_png is not None else Path(metrics_jsonl).with_name(PLOT_NAME)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7))
    draw_forecast(top, "run", run)
    draw_entropy(bottom, "run", run)
    for ax in (top, bottom):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path, help="verl's metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help=f"PNG path (default: {PLOT_NAME} next to the metrics)")
    args = parser.parse_args(argv)
    print(plot_forecast(args.metrics, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
