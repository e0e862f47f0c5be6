# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The controller's section of the study report (issue 46): its decisions per step and the arms' band hold.

    notes, plots = control_section(runs, out_dir)    # runs: {arm: calibration.Step list}, as the study reads them
    write_report(metrics, out_dir, notes=notes, extra_plots=plots)

- ``control_decisions.png``: per arm that ran the controller (it logged a band), two panels. Top: the band, the aim,
  E's predicted entropy after the update without the controller's step (``control/predicted_before``) and with it
  (``control/predicted_after``), and the rollout entropy the step's batch then had (nats per token). Bottom: the
  controller's step's predicted change ``c · b`` (``control/predicted_change``) against the change realised on E's
  held-out half (``control/realised_heldout`` ± 2 SE), and the coefficient ``c`` on a second axis.
- the band-hold table: every arm judged on the band of the arm named ``controlled`` (else the first arm with a band),
  with :func:`treetune_verl.control.band_hold.band_hold` (the README's table, as HTML).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

from treetune_verl.control.band_hold import FIRST_STEP, band_hold, logged_band
from treetune_verl.forecast.calibration import Step

CONTROLLED_ARM = "controlled"  # the study's arm whose band judges the others (forecast_study.py ARM_BLOCKS)


def controlled_arms(runs: dict[str, Sequence[Step]]) -> list[str]:
    """The arms that ran the controller: those that logged a band."""
    return [arm for arm, run in runs.items() if any(math.isfinite(s.band_low) for s in run)]


def _points(run: Sequence[Step], attr: str) -> tuple[list[int], list[float]]:
    points = [(s.step, getattr(s, attr)) for s in run if math.isfinite(getattr(s, attr))]
    return [p[0] for p in points], [p[1] for p in points]


def draw_decisions(top, bottom, arm: str, run: Sequence[Step]) -> None:
    """One controlled arm's decisions on two axes (module docstring)."""
    banded = [s for s in run if math.isfinite(s.band_low) and math.isfinite(s.band_high)]
    top.fill_between(
        [s.step for s in banded],
        [s.band_low for s in banded],
        [s.band_high for s in banded],
        color="tab:green",
        alpha=0.12,
        step="mid",
        label="band",
    )
    top.plot(*_points(run, "control_aim"), "_", color="tab:green", markersize=12, label="aim")
    top.plot(*_points(run, "control_predicted_before"), "v", color="tab:red", label="predicted after the update, stock")
    top.plot(*_points(run, "control_predicted_after"), "^", color="tab:blue", label="predicted, with the controller")
    top.plot(*_points(run, "rollout_entropy"), "-o", color="black", markersize=3, label="rollout entropy (the batch)")
    top.set_title(f"{arm}: the controller's decisions")
    top.set_ylabel("entropy (nats per token)")
    top.legend(fontsize=7)
    decided = [s for s in run if math.isfinite(s.control_predicted_change)]
    bottom.plot([s.step for s in decided], [s.control_predicted_change for s in decided], "x", color="tab:blue")
    realised = [s for s in decided if math.isfinite(s.control_realised)]
    bottom.errorbar(
        [s.step + 0.15 for s in realised],
        [s.control_realised for s in realised],
        yerr=[2 * s.control_realised_se if math.isfinite(s.control_realised_se) else 0.0 for s in realised],
        fmt="o",
        color="black",
        markersize=3,
        capsize=2,
    )
    bottom.axhline(0.0, color="grey", linewidth=0.6)
    bottom.set_ylabel("the step's change (nats per token)", fontsize=8)
    bottom.set_xlabel("training step")
    bottom.legend(["predicted c·b", "realised on E's held-out half ± 2 SE"], fontsize=7)
    coefficient = bottom.twinx()
    coefficient.bar(*_points(run, "control_coefficient"), width=0.5, color="grey", alpha=0.3)
    coefficient.set_ylabel("coefficient c (bars)", fontsize=7)


def plot_decisions(runs: dict[str, Sequence[Step]], out: Path) -> Path | None:
    """:func:`draw_decisions` for every controlled arm; ``None`` (nothing written) when no arm ran the controller."""
    arms = controlled_arms(runs)
    if not arms:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2 * len(arms), 1, figsize=(8, 5.5 * len(arms)), squeeze=False)
    for i, arm in enumerate(arms):
        draw_decisions(axes[2 * i, 0], axes[2 * i + 1, 0], arm, runs[arm])
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def band_hold_html(runs: dict[str, Sequence[Step]], first_step: int = FIRST_STEP) -> str:
    """Every arm judged on the controlled arm's band, as an HTML table; ``""`` when no arm ran the controller."""
    arms = controlled_arms(runs)
    if not arms:
        return ""
    source = CONTROLLED_ARM if CONTROLLED_ARM in arms else arms[0]
    low, high = logged_band(runs[source], first_step)
    rows = {arm: band_hold(run, low, high, first_step) for arm, run in runs.items()}

    def cell(value: float, fmt: str) -> str:
        return fmt.format(value) if math.isfinite(value) else "–"

    head = (
        f"<tr><th>arm</th><th>band [{low:.2f}, {high:.2f}] held, steps ≥ {first_step}</th><th>overshoot (nats)</th>"
        "<th>rollout entropy start → lowest</th><th>final reward (last 5)</th><th>response length start → final</th>"
        "<th>controller / update</th><th>forecast + controller / verl's update</th></tr>"
    )
    body = "".join(
        f"<tr><th>{html.escape(arm)}</th><td>{r.band_hold:.0%} ({round(r.band_hold * r.steps)}/{r.steps})</td>"
        f"<td>{r.overshoot:.2f}</td><td>{r.start:.2f} → {r.lowest:.3f} ({r.lowest_share:.0%})</td>"
        f"<td>{cell(r.final_reward, '{:.3f}')}</td><td>{r.length_start:.1f} → {cell(r.final_length, '{:.1f}')}</td>"
        f"<td>{cell(r.control_cost_ratio, '{:.2f}')}</td><td>{cell(r.probe_cost_ratio, '{:.2f}')}</td></tr>"
        for arm, r in rows.items()
    )
    return (
        f"<h2>Holding the band</h2><p>Every arm judged on the band the {html.escape(source)} arm logged (rollout "
        "entropy of each step's batch; <code>python -m treetune_verl.control.band_hold</code> gives the same "
        f"table).</p><table>{head}{body}</table>"
    )


def control_section(runs: dict[str, Sequence[Step]], out_dir: str | Path) -> tuple[str, dict[str, Path]]:
    """The section's HTML and its plot (none when no arm ran the controller), for ``study_report.write_report``."""
    plot = plot_decisions(runs, Path(out_dir) / "control_decisions.png")
    plots = {} if plot is None else {"The controller's decisions per step": plot}
    return band_hold_html(runs), plots
