# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast study's report: ``report.html`` with its PNGs and ``study.json``, from one or more runs' metrics.

    python -m treetune_verl.forecast.study_report collapsing=outputs/study/collapsing/metrics.jsonl \\
        stable=outputs/study/stable/metrics.jsonl --out outputs/study

Per run (an "arm"): the entropy (rollout, actor, E's) with the collapse warnings over it; reward and response length;
forecast vs realised change per step with ±2 standard errors; and over the arms: the calibration (z of the realised
change against the forecast, its histogram, ±2 SE coverage), forecast against realised, and the table of
``calibration.calibration``. ``study.json`` holds every figure and every step's values (NaN as null).
"""

from __future__ import annotations

import argparse
import html
import json
import math
from pathlib import Path

from treetune_verl.forecast.calibration import Step, calibration, figures_json, pooled, read_run, run_json, z_scores

COLOURS = ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:olive", "tab:cyan")


def arm_colours(runs: dict) -> list[str]:
    """One colour per arm, in order (cycled past the palette: no arm is left off a plot)."""
    return [COLOURS[i % len(COLOURS)] for i in range(len(runs))]


AGREEMENT_ROWS = (
    ("forecast_steps", "forecast steps", "{:d}"),
    ("pearson", "Pearson(forecast, realised)", "{:.3f}"),
    ("sign_agreement", "sign agreement where |realised| > 2 SE", "{:.0%}"),
    ("clear_steps", "steps with |realised| > 2 SE", "{:d}"),
    ("coverage_combined", "|z| ≤ 2, combined SE", "{:.0%}"),
    ("coverage_paired", "|z| ≤ 2, paired SE", "{:.0%}"),
    ("coverage_predictive", "|z| ≤ 2, predictive SE (paired + unforecast curvature)", "{:.0%}"),
    ("median_predictive_se", "median predictive SE (nats/token)", "{:.4f}"),
    ("median_forecast_se", "median forecast SE (nats/token)", "{:.4f}"),
    ("median_abs_realised", "median |realised| (nats/token)", "{:.4f}"),
    ("se_over_realised", "median SE / median |realised|", "{:.2f}"),
    ("median_abs_error", "median |realised − forecast| (nats/token)", "{:.4f}"),
)
RUN_ROWS = (
    ("start_rollout_entropy", "rollout entropy at step 1 (nats/token)", "{:.3f}"),
    ("min_rollout_entropy", "lowest rollout entropy", "{:.3f}"),
    ("collapse_step", "first step below ½ of step 1", "{}"),
    ("first_warning_step", "first collapse warning", "{}"),
    ("warning_lead", "warning lead (steps)", "{}"),
    ("warning_steps", "steps with a warning", "{:d}"),
    ("probe_over_update_actor", "timing_s/probe / timing_s/update_actor", "{:.2f}"),
    ("eval_gen_token_share", "E's share of the rollout's tokens", "{:.2f}"),
)
# The forecast exact in the softmax first: the predictor the study ships (calibration.py); ΔH₁, its first-order term
# (linear in Δθ, what the early warning projects), after it.
TABLE_SECTIONS = (
    (
        "The forecast (exact in the softmax) vs realised, at the same states (all of E)",
        "softmax_same_states",
        AGREEMENT_ROWS,
    ),
    ("The forecast (exact in the softmax), held out", "softmax_held_out", AGREEMENT_ROWS),
    ("Its first-order term ΔH₁ vs realised, at the same states", "same_states", AGREEMENT_ROWS),
    ("ΔH₁ held out: from half of E's responses, realised on the other half", "held_out", AGREEMENT_ROWS),
    ("The run", None, RUN_ROWS),
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _steps(run: list[Step], attr: str) -> tuple[list[int], list[float]]:
    points = [(s.step, getattr(s, attr)) for s in run if math.isfinite(getattr(s, attr))]
    return [p[0] for p in points], [p[1] for p in points]


def draw_entropy(ax, arm: str, run: list[Step], colour: str = COLOURS[0]) -> None:
    """Rollout, actor and E's entropy per step, the collapse line (½ of step 1) and the collapse warnings."""
    ax.plot(*_steps(run, "rollout_entropy"), "-o", color=colour, label="rollout entropy (sampling time)")
    ax.plot(*_steps(run, "actor_entropy"), "--", color="grey", label="actor/entropy (verl, same tokens)")
    ax.plot(*_steps(run, "h_before"), ":x", color="black", label="E's token entropy before the update")
    half = 0.5 * run[0].rollout_entropy
    ax.axhline(half, color="black", linewidth=0.8, linestyle="-.", label="½ of step 1 (collapse)")
    for i, s in enumerate(w for w in run if w.warning):
        ax.axvspan(s.step - 0.4, s.step + 0.4, color="red", alpha=0.15, label="collapse warning" if i == 0 else None)
    controlled = [s for s in run if math.isfinite(s.band_low) and math.isfinite(s.band_high)]
    if controlled:  # the controller's band at each step it decided, and its coefficient on a second axis
        steps = [s.step for s in controlled]
        ax.fill_between(
            steps,
            [s.band_low for s in controlled],
            [s.band_high for s in controlled],
            color=colour,
            alpha=0.12,
            step="mid",
            label="the controller's band",
        )
        coefficient = ax.twinx()
        coefficient.bar(*_steps(run, "control_coefficient"), width=0.5, color="grey", alpha=0.35)
        coefficient.set_ylabel("the controller's coefficient (bars)", fontsize=7)
    ax.set_title(f"{arm}: entropy and the collapse warnings")
    ax.set_xlabel("training step")
    ax.set_ylabel("entropy (nats per token)")
    ax.legend(fontsize=7)


def draw_forecast(ax, arm: str, run: list[Step]) -> None:
    """Forecast and realised change per step, ±2 standard errors."""
    probed = [s for s in run if s.forecast_step]
    ax.errorbar(
        [s.step - 0.1 for s in probed],
        [s.forecast for s in probed],
        yerr=[2 * s.forecast_se for s in probed],
        fmt="o",
        capsize=3,
        color="tab:orange",
        label="forecast ΔH₁ (before the update) ± 2 SE",
    )
    softmax = [s for s in probed if math.isfinite(s.softmax)]
    if softmax:
        ax.plot(
            [s.step for s in softmax],
            [s.softmax for s in softmax],
            "D",
            markerfacecolor="none",
            color="tab:green",
            label="forecast exact in the softmax",
        )
    ax.errorbar(
        [s.step + 0.1 for s in probed],
        [s.realised for s in probed],
        yerr=[2 * s.realised_se for s in probed],
        fmt="k*",
        capsize=3,
        label="realised change at the same states ± 2 SE",
    )
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_title(f"{arm}: forecast vs realised entropy change per update")
    ax.set_xlabel("training step")
    ax.set_ylabel("Δ token entropy (nats per token)")
    ax.legend(fontsize=7)


def _panels(runs: dict[str, list[Step]], out: Path, draw) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 3.2 * len(runs)), squeeze=False)
    for i, (ax, (arm, run)) in enumerate(zip(axes[:, 0], runs.items(), strict=True)):
        draw(ax, arm, run, i)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_entropy(runs: dict[str, list[Step]], out: Path) -> Path:
    """:func:`draw_entropy`, one panel per arm."""
    colours = arm_colours(runs)
    return _panels(runs, out, lambda ax, arm, run, i: draw_entropy(ax, arm, run, colours[i]))


def plot_forecast(runs: dict[str, list[Step]], out: Path) -> Path:
    """:func:`draw_forecast`, one panel per arm."""
    return _panels(runs, out, lambda ax, arm, run, i: draw_forecast(ax, arm, run))


def plot_reward_length(runs: dict[str, list[Step]], out: Path) -> Path:
    """Reward and response length per step, every arm."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5))
    for (arm, run), colour in zip(runs.items(), arm_colours(runs), strict=True):
        top.plot(*_steps(run, "reward"), "-o", color=colour, label=arm)
        bottom.plot(*_steps(run, "response_length"), "-o", color=colour, label=arm)
    top.set_ylabel("reward (critic/score/mean)")
    bottom.set_ylabel("response length (tokens)")
    for ax in (top, bottom):
        ax.set_xlabel("training step")
        ax.legend(fontsize=8)
    top.set_title("Reward and response length")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_calibration(runs: dict[str, list[Step]], out: Path) -> Path:
    """Forecast against realised (every arm, y = x), and the histogram of z with the combined and the paired SE."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    lows, highs = [], []
    for (arm, run), colour in zip(runs.items(), arm_colours(runs), strict=True):
        probed = [s for s in run if s.forecast_step]
        left.errorbar(
            [s.forecast for s in probed],
            [s.realised for s in probed],
            xerr=[s.forecast_se for s in probed],
            yerr=[s.realised_se for s in probed],
            fmt="o",
            color=colour,
            alpha=0.8,
            label=arm,
        )
        values = [s.forecast for s in probed] + [s.realised for s in probed]
        lows.append(min(values, default=0.0))
        highs.append(max(values, default=0.0))
    low, high = min(lows, default=-1.0), max(highs, default=1.0)
    left.plot([low, high], [low, high], color="grey", linewidth=0.8, label="realised = forecast")
    left.set_xlabel("forecast ΔH₁ (nats per token)")
    left.set_ylabel("realised change (nats per token)")
    left.set_title("Forecast against realised (±1 SE)")
    left.legend(fontsize=8)
    probed = [s for run in runs.values() for s in run if s.forecast_step]
    kinds = (
        ("held_out", "tab:green", "held out (independent halves), combined SE"),
        ("paired", "tab:orange", "same states, paired SE"),
        ("combined", "tab:blue", "same states, combined SE"),
    )
    for kind, colour, name in kinds:
        z = [v for v in z_scores(probed, kind) if math.isfinite(v)]
        right.hist([max(-6.0, min(6.0, v)) for v in z], bins=24, range=(-6, 6), alpha=0.4, color=colour, label=name)
    right.axvline(-2, color="black", linewidth=0.8, linestyle=":")
    right.axvline(2, color="black", linewidth=0.8, linestyle=":", label="±2")
    right.set_xlabel("z = (realised − forecast) / SE (clipped to ±6)")
    right.set_ylabel("forecast steps")
    right.set_title("Calibration: z over every arm's steps")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _cell(key: str, value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return fmt.format(value)


def render_html(figures: dict[str, dict], plots: dict[str, Path], base: Path, notes: str = "") -> str:
    """The page: the calibration table (one column per arm), notes, the PNGs (relative to ``base``)."""
    head = "".join(f"<th>{html.escape(arm)}</th>" for arm in figures)
    rows = ""
    for title, section, table_rows in TABLE_SECTIONS:
        if section and not any(section in f for f in figures.values()):
            continue  # e.g. the softmax forecast of runs that did not log it
        rows += f'<tr><th colspan="{len(figures) + 1}" class=section>{html.escape(title)}</th></tr>'
        for key, label, fmt in table_rows:
            cells = [(f.get(section, {}) if section else f).get(key) for f in figures.values()]
            if all(cell is None for cell in cells):
                continue
            rows += (
                f"<tr><th>{html.escape(label)}</th>"
                + "".join(f"<td>{_cell(key, cell, fmt)}</td>" for cell in cells)
                + "</tr>"
            )
    images = "".join(
        f'<figure><img src="{html.escape(str(path.relative_to(base)))}" alt="{html.escape(name)}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
        for name, path in plots.items()
    )
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>Entropy forecast study</title><style>"
        "body{font-family:sans-serif;max-width:72em;margin:auto;padding:0 1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}th.section{background:#eee}"
        "figure{margin:1em 0}img{max-width:100%}"
        "</style></head><body><h1>Is the entropy forecast right?</h1>"
        "<p>The forecast is the change of E's token entropy (the mean entropy of the policy's next-token "
        "distribution over the states E's fresh responses visit, nats per token) over the update's first optimizer "
        "step, taken before the update goes on: the logits moved along their tangent (first order in the weights) "
        "and the entropy of the moved softmax taken exactly. ΔH₁, its first-order term, is linear in the step (the "
        "figure the early warning projects); where distributions have become peaked, H is far from linear in the "
        "logits and the two part. The realised change is measured at the same states after that step. z = "
        "(realised − forecast) / SE with the combined SE √(SE_f² + SE_r²), the paired difference's SE, or the "
        "forecast's predictive SE (paired, plus the network's curvature it leaves out, taken of the size of the "
        "softmax's it includes). At the same states forecast and realised share their sampling error, so the "
        "combined SE counts it twice; held out, the forecast from half of E's responses meets the realised change "
        "on the other half: independent samples. A pooled column takes the forecast steps of several arms together "
        "(18 steps of one arm put coverage in steps of 5.6 %).</p>"
        f"{notes}<h2>Figures</h2><table><tr><th></th>{head}</tr>{rows}</table><h2>Plots</h2>{images}</body></html>"
    )


def write_report(
    metrics: dict[str, str | Path],
    out_dir: str | Path,
    notes: str = "",
    pools: dict[str, list[str]] | None = None,
    extra_plots: dict[str, Path] | None = None,
) -> Path:
    """Read every arm's ``metrics.jsonl``, write the PNGs, ``report.html`` and ``study.json`` into ``out_dir``;
    returns the page's path. ``pools``: a column per name with the forecast figures over the named arms' forecast
    steps together (``calibration.pooled``), e.g. ``{"collapsing runs": ["a", "b"]}``. ``notes`` (HTML) and
    ``extra_plots`` (PNGs under ``out_dir``) come from outside the forecast, e.g. the controller's section
    (``treetune_verl.control.report``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = {arm: read_run(path) for arm, path in metrics.items()}
    plots = {
        "Entropy per step, collapse warnings shaded": plot_entropy(runs, out / "entropy.png"),
        "Forecast vs realised per step": plot_forecast(runs, out / "forecast_vs_realised.png"),
        "Calibration": plot_calibration(runs, out / "calibration.png"),
        "Reward and response length": plot_reward_length(runs, out / "reward_length.png"),
        **(extra_plots or {}),
    }
    figures = {arm: calibration(run) for arm, run in runs.items()}
    for name, arms in (pools or {}).items():
        unknown = [arm for arm in arms if arm not in runs]
        if unknown or name in runs:
            raise ValueError(f"pool {name!r}: arms {unknown} not among {list(runs)}, or its name is an arm's")
        figures[name] = pooled([runs[arm] for arm in arms])
    study = {
        "arms": {arm: run_json(run) for arm, run in runs.items()},
        "pools": {name: figures_json(figures[name]) for name in pools or {}},
        "metrics": {a: str(p) for a, p in metrics.items()},
    }
    study["pooled_forecast_steps"] = sum(s.forecast_step for run in runs.values() for s in run)
    (out / "study.json").write_text(json.dumps(study, indent=1))
    page = out / "report.html"
    page.write_text(render_html(figures, plots, out, notes))
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="arm=path/to/metrics.jsonl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--pool", action="append", default=[], help="name=arm,arm: a column with those arms' forecast steps pooled"
    )
    args = parser.parse_args(argv)
    metrics, pools = {}, {}
    for item in args.runs:
        arm, sep, path = item.partition("=")
        if not sep or not arm or not path:
            parser.error(f"{item!r}: expected arm=path/to/metrics.jsonl")
        metrics[arm] = Path(path)
    for item in args.pool:
        name, sep, arms = item.partition("=")
        if not sep or not name or not arms:
            parser.error(f"--pool {item!r}: expected name=arm,arm")
        pools[name] = arms.split(",")
    print(write_report(metrics, args.out, pools=pools))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
