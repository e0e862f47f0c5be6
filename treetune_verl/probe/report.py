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
    """Mean, sample std (``None`` for one value) and median of ``values``."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "median": statistics.median(values),
    }


def estimator_entries(probes: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per estimator, from its ``run_mixed_probe`` results over repeats: ``units``, ``deltaH1`` and (with ground
    truth) ``deltaH_true`` summaries in those units, and the RB ``baseline`` mode."""
    entries: dict[str, dict[str, Any]] = {}
    for name, results in probes.items():
        entry: dict[str, Any] = {"units": results[0]["target_units"]}
        entry["deltaH1"] = summary([r["deltaH1"] for r in results])
        if "deltaH_true" in results[0]:
            entry["deltaH_true"] = summary([r["deltaH_true"] for r in results])
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


def format_table(results: dict[str, Any]) -> str:
    """Human-readable summary of ``run_probe_job``'s results."""
    cfg = results["config"]
    t = results["timing_median_s"]
    lines = [
        f"entropy probe: {results['model']} on {results['device']}, B_E={cfg['batch']['B_E']} "
        f"B_U={cfg['batch']['B_U']} G={cfg['batch']['G']}, repeats={cfg['run']['repeats']}, "
        f"optimizer={cfg['optimizer']['name']} lr={results['lr']:g} (P={results['preconditioner']}, "
        f"{results['params_without_state']}/{results['params']} params without state), "
        f"mean reward on U={results['mean_reward_U']:.2f}",
        f"{'estimator':<24}{'dH1 mean':>12}{'dH1 std':>12}{'dH_true mean':>14}{'X s/batch':>11}  units",
    ]
    for name, entry in results["estimators"].items():
        label = name if name == "naive" else f"{name} ({entry.get('baseline')})"
        true_mean = entry["deltaH_true"]["mean"] if "deltaH_true" in entry else None
        lines.append(
            f"{label:<24}{_fmt(entry['deltaH1']['mean']):>12}{_fmt(entry['deltaH1']['std'], signed=False):>12}"
            f"{_fmt(true_mean):>14}{t[f'X_s[{name}]']:>11.2f}  {entry['units']}"
        )
    if "std_ratio_naive_over_rb" in results:
        lines.append(f"spread ratio std(naive)/std(rb_residual) = {results['std_ratio_naive_over_rb']:.2f}")
    lines.append(
        "time per phase (median s): " + ", ".join(f"{k}={v:.2f}" for k, v in t.items() if not k.startswith("X_s["))
    )
    lines.append(
        f"Cui et al. covariance estimate -lr*Cov(log pi, A) on U: {_fmt(statistics.fmean(results['cui_covariance_deltaH']))} nats per token"
    )
    lines.append(f"results: {results['json_path']}")
    return "\n".join(lines)
