# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main job's report: summaries over repeats, the per-estimator entries of the results, the printed table.

Last step of the probe's path: ``job.run_probe_job`` collects one ``run_mixed_probe`` result per (repeat,
estimator); ``estimator_entries`` summarises them per estimator (ΔH₁ and ΔH_true in the estimator's target units,
nats) and ``format_table`` renders the results written to ``probe_results.json``.
"""

from __future__ import annotations

import statistics
from typing import Any


def summary(values: list[float]) -> dict[str, float | None]:
    """Mean, sample std, standard error of the mean (``None`` both for one value) and median of ``values``."""
    std = statistics.stdev(values) if len(values) > 1 else None
    return {
        "mean": statistics.fmean(values),
        "std": std,
        "sem": None if std is None else std / len(values) ** 0.5,
        "median": statistics.median(values),
    }


def agreement(deltaH1: list[float], deltaH_true: list[float]) -> dict[str, float | bool | None]:
    """ΔH₁ against ΔH_true, paired per repeat (both measured on the same E batch, so E's sampling noise common to
    both cancels): the summary of the differences ΔH₁ − ΔH_true and ``agrees`` = |mean difference| <= 2 standard
    errors of it (``None`` with one repeat). The differences hold X's estimation noise, ΔH_true's importance-weighting
    noise and ΔH_true's higher-order terms; a significant mean difference would be a bias.
    """
    diff = summary([a - b for a, b in zip(deltaH1, deltaH_true, strict=True)])
    agrees = None if diff["sem"] is None else abs(diff["mean"]) <= 2 * diff["sem"]  # type: ignore[operator]
    return {**diff, "agrees": agrees}


def estimator_entries(probes: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per estimator, from its ``run_mixed_probe`` results over repeats: ``units``, ``deltaH1`` and (with ground
    truth) ``deltaH_true`` summaries in those units, and the RB ``baseline`` mode."""
    entries: dict[str, dict[str, Any]] = {}
    for name, results in probes.items():
        entry: dict[str, Any] = {"units": results[0]["target_units"]}
        entry["deltaH1"] = summary([r["deltaH1"] for r in results])
        if "deltaH_true" in results[0]:
            truths = [r["deltaH_true"] for r in results]
            entry["deltaH_true"] = summary(truths)
            entry["deltaH1_minus_true"] = agreement([r["deltaH1"] for r in results], truths)
        if name == "rb_residual":
            entry["baseline"] = results[0]["baseline_mode"]
        entries[name] = entry
    return entries


def per_repeat_rows(probes: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per repeat, per estimator: ``bars_dot`` (⟨X̄, Δθ/lr⟩), ``deltaH1`` (nats) and ``norm_X`` (‖X̄‖)."""
    rows: list[dict[str, Any]] = [{"repeat": r} for r in range(len(next(iter(probes.values()))))]
    for name, results in probes.items():
        for row, result in zip(rows, results, strict=True):
            row[name] = {key: result[key] for key in ("bars_dot", "deltaH1", "norm_X")}
    return rows


def std_ratio(entries: dict[str, dict[str, Any]]) -> float | None:
    """std(ΔH₁ naive) / std(ΔH₁ rb_residual), when both ran with more than one repeat (and the latter is non-zero)."""
    stds = {name: entry["deltaH1"]["std"] for name, entry in entries.items()}
    if "naive" in stds and "rb_residual" in stds and stds["naive"] is not None and stds["rb_residual"]:
        return stds["naive"] / stds["rb_residual"]
    return None


def _fmt(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.3e}" if signed else f"{value:.3e}"


def _agreement_cell(entry: dict[str, Any]) -> tuple[str, str]:
    diff = entry.get("deltaH1_minus_true")
    if diff is None:
        return "n/a", "n/a"
    if diff["sem"] is None:
        return f"{diff['mean']:+.2e}", "n/a"
    return f"{diff['mean']:+.2e} ± {2 * diff['sem']:.1e}", "yes" if diff["agrees"] else "NO"


def format_table(results: dict[str, Any]) -> str:
    """Human-readable summary of ``run_probe_job``'s results.

    Columns: ΔH₁'s mean over repeats and its spread (sample std over repeats, each a fresh E batch), ΔH_true's mean,
    the paired difference ΔH₁ − ΔH_true with 2 standard errors, whether they agree (``report.agreement``), X's time.
    """
    cfg = results["config"]
    t = results["timing_median_s"]
    state = results.get("optimizer_state_step")
    state_text = "" if state is None else f"state after {state} steps, "
    lines = [
        f"entropy probe: {results['model']} on {results['device']}, B_E={cfg['batch']['B_E']} "
        f"B_U={cfg['batch']['B_U']} G={cfg['batch']['G']}, repeats={cfg['run']['repeats']}, "
        f"optimizer={cfg['optimizer']['name']} lr={results['lr']:g} (P={results['preconditioner']}, {state_text}"
        f"{results['params_without_state']}/{results['params']} params without state), "
        f"mean reward on U={results['mean_reward_U']:.2f}",
        f"{'estimator':<26}{'dH1 mean':>11}{'dH1 std':>11}{'dH_true mean':>13}{'dH1-dH_true (±2SE)':>22}{'agree':>6}"
        f"{'X s/batch':>10}  units",
    ]
    for name, entry in results["estimators"].items():
        label = name if name == "naive" else f"{name} ({entry.get('baseline')})"
        true_mean = entry["deltaH_true"]["mean"] if "deltaH_true" in entry else None
        diff, agrees = _agreement_cell(entry)
        lines.append(
            f"{label:<26}{_fmt(entry['deltaH1']['mean']):>11}{_fmt(entry['deltaH1']['std'], signed=False):>11}"
            f"{_fmt(true_mean):>13}{diff:>22}{agrees:>6}{t[f'X_s[{name}]']:>10.2f}  {entry['units']}"
        )
    if "std_ratio_naive_over_rb" in results:
        lines.append(f"spread ratio std(naive)/std(rb_residual) = {results['std_ratio_naive_over_rb']:.2f}")
    lines.append(
        "time per phase (median s): " + ", ".join(f"{k}={v:.2f}" for k, v in t.items() if not k.startswith("X_s["))
    )
    lines.append(
        f"Cui et al. covariance estimate -lr*Cov(log pi, A) on U: {_fmt(statistics.fmean(results['cui_covariance_deltaH']))}"
        " nats per token (a logit-space step of size lr: compare sign and order of magnitude only)"
    )
    lines.append(f"results: {results['json_path']}")
    return "\n".join(lines)
