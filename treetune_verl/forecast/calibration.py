# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Is the forecast right? Per-step series of a run's ``metrics.jsonl`` and the calibration figures over its steps.

verl's file logger writes one JSON object per training step, ``{"step": n, "data": {...}}``. A run with the forecast
block logs at every probed step the token-entropy forecast of E (``token_entropy.py``, nats per token):
``probe/token/deltaH1`` ± ``_se`` (before the update, first order along its step), the realised change at the same
states ``probe/token/deltaH_realised_first_step`` ± ``_se`` and the standard error of their paired difference
``probe/token/error_se``; and every step the trainer's ``timing_s/agent_loop/rollout_entropy/mean`` (the entropy the
rollout sampled with, nats per token), ``actor/entropy``, ``critic/score/mean`` and ``response_length/mean``.

Figures over the forecast steps (``agreement``), twice (``calibration``):

- ``same_states``: the forecast over all of E against the realised change at the same states. Their sampling errors
  are nearly the same (the same states), so what separates them is the forecast's own error, second order in the
  step; ``coverage_paired`` judges it by the paired difference's standard error (``probe/token/error_se``), and the
  combined SE √(SE_f² + SE_r²) of the issue counts the shared error twice;
- ``held_out``: the forecast from the first half of every prompt's responses (``probe/token/holdout/deltaH1``)
  against the realised change on the other half (``.../holdout/deltaH_realised_first_step``): the same quantity from
  independent samples, where the combined SE is the right one.

Each: ``pearson`` (forecast, realised); ``sign_agreement``, the share of steps with the forecast's sign among those
whose realised change is clear, |realised| > 2 SE(realised); ``coverage_combined``, the share of steps with |z| <= 2,
z = (realised − forecast) / √(SE_f² + SE_r²); ``median_forecast_se``, ``median_abs_realised`` and their ratio (a
calibrated forecast is also a precise one); ``median_abs_error``, the median |realised − forecast|.

Collapse (``collapse_step``): the first step whose rollout entropy is below ``fraction`` (½) of the first step's; the
warning's lead is the number of steps from the first collapse warning to it.

The forecast exact in the softmax (``probe/token/deltaH_softmax``, ``softmax_tangent.py``: the logits moved along
their tangent, the entropy taken exactly), the predictor the study judges first, gets the same figures
(``softmax_same_states``, ``softmax_held_out``) against the same realised changes, and at the same states its
**predictive** standard error, the error bar of "the realised change will be here":

    SE_pred = √(SE_paired² + (ΔH_softmax − ΔH₁)²)

the paired difference's sampling error plus the part of the step the forecast leaves out, the network's own curvature
along Δθ (ℓ's second-order term), taken to be of the size of the curvature it does include, the softmax's
(ΔH_softmax − ΔH₁): on the runs where both were measured the network's curvature was as large as the softmax's and
of either sign (``treetune_specs/2026-11-28-forecast-calibration.md``). ``coverage_predictive``: the share of steps
with |realised − ΔH_softmax| ≤ 2 SE_pred; ``median_predictive_se``. The combined SE counts the shared sampling error
twice, the paired SE counts no model error: the predictive SE is the one a calibrated forecast is judged by at the
same states, and the one a controller acting on the forecast can trust.

``pooled`` gives the same figures over the forecast steps of several runs (e.g. every collapsing run): 18 steps of
one run put ±2 SE coverage in steps of 5.6 %, so the 90-98 % band is one miss wide there.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

ROLLOUT_ENTROPY = "timing_s/agent_loop/rollout_entropy/mean"
ACTOR_ENTROPY = "actor/entropy"
REWARD = "critic/score/mean"
RESPONSE_LENGTH = "response_length/mean"
TOKEN = "probe/token/"
FORECAST, FORECAST_SE = TOKEN + "deltaH1", TOKEN + "deltaH1_se"
REALISED, REALISED_SE = TOKEN + "deltaH_realised_first_step", TOKEN + "deltaH_realised_first_step_se"
ERROR_SE, H_BEFORE = TOKEN + "error_se", TOKEN + "H_before"
HOLDOUT_FORECAST, HOLDOUT_REALISED = TOKEN + "holdout/deltaH1", TOKEN + "holdout/deltaH_realised_first_step"
ON_POLICY = TOKEN + "deltaH1_on_policy"
SOFTMAX, SOFTMAX_ERROR_SE = TOKEN + "deltaH_softmax", TOKEN + "softmax_error_se"
HOLDOUT_SOFTMAX = TOKEN + "holdout/deltaH_softmax"
COLLAPSE_WARNING = "probe/warning/collapse"
PROBE_S, UPDATE_ACTOR_S, GEN_S = "timing_s/probe", "timing_s/update_actor", "timing_s/gen"
EVAL_GEN_SHARE = "probe/eval_gen_token_share"
PROBE_COST_RATIO = "probe/cost_ratio"  # the forecast's seconds (the controller's inside) over verl's own update's
# the entropy controller's (treetune_verl/control), in a controlled arm only
BAND_LOW, BAND_HIGH = "control/band_low", "control/band_high"
CONTROL_COEFFICIENT, CONTROL_COST_RATIO = "control/coefficient", "control/cost_ratio"
CONTROL_AIM, CONTROL_SENSITIVITY = "control/aim", "control/b"
CONTROL_PREDICTED_BEFORE, CONTROL_PREDICTED_AFTER = "control/predicted_before", "control/predicted_after"
CONTROL_PREDICTED_CHANGE, CONTROL_REALISED = "control/predicted_change", "control/realised_heldout"


@dataclass(frozen=True)
class Step:
    """One training step of a run (NaN where the run did not log the value)."""

    step: int
    rollout_entropy: float
    actor_entropy: float
    reward: float
    response_length: float
    forecast: float = math.nan
    forecast_se: float = math.nan
    realised: float = math.nan
    realised_se: float = math.nan
    error_se: float = math.nan
    h_before: float = math.nan
    holdout_forecast: float = math.nan
    holdout_forecast_se: float = math.nan
    holdout_realised: float = math.nan
    holdout_realised_se: float = math.nan
    on_policy: float = math.nan
    on_policy_se: float = math.nan
    softmax: float = math.nan  # the forecast exact in the softmax (softmax_tangent.py)
    softmax_se: float = math.nan
    softmax_error_se: float = math.nan
    holdout_softmax: float = math.nan
    holdout_softmax_se: float = math.nan
    warning: bool = False
    probe_s: float = math.nan
    update_actor_s: float = math.nan  # verl's timer around the whole actor update: the forecast's seconds are inside it
    probe_cost_ratio: float = math.nan
    eval_gen_share: float = math.nan
    band_low: float = math.nan  # the controller's band (nats per token), NaN without the controller
    band_high: float = math.nan
    control_coefficient: float = math.nan
    control_cost_ratio: float = math.nan
    # the controller's decision (nats per token, at E's states): the level it aimed at, the level predicted after the
    # update without and with its step, its step's predicted change c·b, and that change realised on E's held-out
    # half (± SE); b, the measured change per unit coefficient
    control_aim: float = math.nan
    control_predicted_before: float = math.nan
    control_predicted_after: float = math.nan
    control_predicted_change: float = math.nan
    control_realised: float = math.nan
    control_realised_se: float = math.nan
    control_sensitivity: float = math.nan

    @property
    def forecast_step(self) -> bool:
        return math.isfinite(self.forecast) and math.isfinite(self.realised)


def _value(data: dict, key: str) -> float:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def read_run(metrics_jsonl: str | Path) -> list[Step]:
    """The training steps of a run's ``metrics.jsonl``, in order (records of validation metrics alone skipped).

    Raises:
        ValueError: a line that is not a ``{"step": n, "data": {...}}`` record (naming the line), or no training step.
    """
    steps = []
    for number, line in enumerate(Path(metrics_jsonl).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step, data = int(record["step"]), dict(record["data"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{metrics_jsonl}:{number}: not a verl file-logger record ({error})") from None
        if ROLLOUT_ENTROPY not in data and "actor/pg_loss" not in data:
            continue  # validation only
        steps.append(
            Step(
                step=step,
                rollout_entropy=_value(data, ROLLOUT_ENTROPY),
                actor_entropy=_value(data, ACTOR_ENTROPY),
                reward=_value(data, REWARD),
                response_length=_value(data, RESPONSE_LENGTH),
                forecast=_value(data, FORECAST),
                forecast_se=_value(data, FORECAST_SE),
                realised=_value(data, REALISED),
                realised_se=_value(data, REALISED_SE),
                error_se=_value(data, ERROR_SE),
                h_before=_value(data, H_BEFORE),
                holdout_forecast=_value(data, HOLDOUT_FORECAST),
                holdout_forecast_se=_value(data, HOLDOUT_FORECAST + "_se"),
                holdout_realised=_value(data, HOLDOUT_REALISED),
                holdout_realised_se=_value(data, HOLDOUT_REALISED + "_se"),
                on_policy=_value(data, ON_POLICY),
                on_policy_se=_value(data, ON_POLICY + "_se"),
                softmax=_value(data, SOFTMAX),
                softmax_se=_value(data, SOFTMAX + "_se"),
                softmax_error_se=_value(data, SOFTMAX_ERROR_SE),
                holdout_softmax=_value(data, HOLDOUT_SOFTMAX),
                holdout_softmax_se=_value(data, HOLDOUT_SOFTMAX + "_se"),
                warning=_value(data, COLLAPSE_WARNING) >= 1.0,
                probe_s=_value(data, PROBE_S),
                update_actor_s=_value(data, UPDATE_ACTOR_S),
                probe_cost_ratio=_value(data, PROBE_COST_RATIO),
                eval_gen_share=_value(data, EVAL_GEN_SHARE),
                band_low=_value(data, BAND_LOW),
                band_high=_value(data, BAND_HIGH),
                control_coefficient=_value(data, CONTROL_COEFFICIENT),
                control_cost_ratio=_value(data, CONTROL_COST_RATIO),
                control_aim=_value(data, CONTROL_AIM),
                control_predicted_before=_value(data, CONTROL_PREDICTED_BEFORE),
                control_predicted_after=_value(data, CONTROL_PREDICTED_AFTER),
                control_predicted_change=_value(data, CONTROL_PREDICTED_CHANGE),
                control_realised=_value(data, CONTROL_REALISED),
                control_realised_se=_value(data, CONTROL_REALISED + "_se"),
                control_sensitivity=_value(data, CONTROL_SENSITIVITY),
            )
        )
    if not steps:
        raise ValueError(f"{metrics_jsonl}: no training step")
    return steps


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson's correlation (NaN for fewer than 2 points or a constant series)."""
    n = len(xs)
    if n < 2:
        return math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


# Step's attributes per forecast and comparison: (forecast, its SE, realised, its SE, the paired difference's SE)
_COLUMNS = {
    ("first_order", "same_states"): ("forecast", "forecast_se", "realised", "realised_se", "error_se"),
    ("first_order", "held_out"): (
        "holdout_forecast",
        "holdout_forecast_se",
        "holdout_realised",
        "holdout_realised_se",
        None,
    ),
    ("softmax", "same_states"): ("softmax", "softmax_se", "realised", "realised_se", "softmax_error_se"),
    ("softmax", "held_out"): ("holdout_softmax", "holdout_softmax_se", "holdout_realised", "holdout_realised_se", None),
}


def z_scores(steps: list[Step], kind: str, forecast: str = "first_order") -> list[float]:
    """(realised − forecast) / its standard error per forecast step: ``combined`` √(SE_f² + SE_r²), ``paired``
    (the paired difference's) or ``predictive`` (the softmax forecast's, :func:`predictive_se`) at the same states,
    or ``held_out`` (combined, the halves' values); of the ``first_order`` forecast ΔH₁ or the ``softmax`` one."""
    if kind == "predictive" and forecast != "softmax":
        raise ValueError("the predictive standard error is the softmax forecast's (forecast='softmax')")
    f, f_se, r, r_se, paired_se = _COLUMNS[forecast, "held_out" if kind == "held_out" else "same_states"]
    out = []
    for s in steps:
        difference = getattr(s, r) - getattr(s, f)
        if kind == "paired":
            se = getattr(s, paired_se)
        elif kind == "predictive":
            se = predictive_se(s)
        else:
            se = math.hypot(getattr(s, f_se), getattr(s, r_se))
        out.append(difference / se if se > 0 else math.nan)
    return out


def predictive_se(step: Step) -> float:
    """The softmax forecast's predictive standard error at the same states (module docstring), nats per token."""
    return math.hypot(step.softmax_error_se, step.softmax - step.forecast)


def _figures(probed: list[Step], forecast: str, comparison: str) -> dict[str, float | int]:
    """:func:`agreement` of one forecast in one comparison; at the same states with ``coverage_paired``, and for the
    softmax forecast there ``coverage_predictive`` and ``median_predictive_se``."""
    columns = _COLUMNS[forecast, comparison]
    figures = agreement(*([getattr(s, name) for s in probed] for name in columns[:4]))
    if comparison == "same_states":
        figures["coverage_paired"] = _share(z_scores(probed, "paired", forecast), lambda v: abs(v) <= 2)
    if (forecast, comparison) == ("softmax", "same_states"):
        figures["coverage_predictive"] = _share(z_scores(probed, "predictive", forecast), lambda v: abs(v) <= 2)
        finite = [se for se in map(predictive_se, probed) if math.isfinite(se)]
        figures["median_predictive_se"] = median(finite) if finite else math.nan
    return figures


def agreement(
    forecast: list[float], forecast_se: list[float], realised: list[float], realised_se: list[float]
) -> dict[str, float | int]:
    """Pearson, sign agreement where |realised| > 2 SE, coverage of |z| ≤ 2 with the combined SE, the median SEs and
    |realised| over the steps given (finite values only)."""
    rows = [
        row
        for row in zip(forecast, forecast_se, realised, realised_se, strict=True)
        if all(math.isfinite(v) for v in row)
    ]
    clear = [(f, r) for f, _, r, r_se in rows if abs(r) > 2 * r_se]
    z = [(r - f) / math.hypot(f_se, r_se) for f, f_se, r, r_se in rows if math.hypot(f_se, r_se) > 0]
    med_error = median(abs(row[2] - row[0]) for row in rows) if rows else math.nan
    med_se = median(row[1] for row in rows) if rows else math.nan
    med_realised = median(abs(row[2]) for row in rows) if rows else math.nan
    return {
        "forecast_steps": len(rows),
        "pearson": pearson([row[0] for row in rows], [row[2] for row in rows]),
        "clear_steps": len(clear),
        "sign_agreement": (
            sum(math.copysign(1, f) == math.copysign(1, r) for f, r in clear) / len(clear) if clear else math.nan
        ),
        "coverage_combined": _share(z, lambda v: abs(v) <= 2),
        "median_forecast_se": med_se,
        "median_abs_realised": med_realised,
        "median_abs_error": med_error,
        "se_over_realised": med_se / med_realised if med_realised > 0 else math.nan,
    }


def collapse_step(steps: list[Step], fraction: float = 0.5) -> int | None:
    """The first step whose rollout entropy is below ``fraction`` of the first step's (None: no collapse)."""
    start = steps[0].rollout_entropy
    return next((s.step for s in steps if s.rollout_entropy < fraction * start), None)


def calibration(steps: list[Step]) -> dict:
    """The figures of the module docstring: ``same_states`` (forecast and realised over all of E, the same states;
    with ``coverage_paired``), ``held_out`` (the forecast from half of E's responses, the realised change on the
    other half: independent samples), the same two of the forecast exact in the softmax (``softmax_same_states``,
    ``softmax_held_out``: absent for runs without it), and the run's collapse, warnings and cost."""
    probed = [s for s in steps if s.forecast_step]
    collapse = collapse_step(steps)
    first_warning = next((s.step for s in steps if s.warning), None)
    ratios = [s.probe_s / s.update_actor_s for s in steps if s.update_actor_s > 0]
    return {
        "steps": len(steps),
        **agreement_sections(probed),
        "start_rollout_entropy": steps[0].rollout_entropy,
        "min_rollout_entropy": min(s.rollout_entropy for s in steps),
        "collapse_step": collapse,
        "first_warning_step": first_warning,
        "warning_steps": sum(s.warning for s in steps),
        "warning_lead": (collapse - first_warning) if collapse is not None and first_warning is not None else None,
        "probe_over_update_actor": median(ratios) if ratios else math.nan,
        "eval_gen_token_share": median(s.eval_gen_share for s in steps) if probed else math.nan,
    }


def agreement_sections(probed: list[Step]) -> dict[str, dict]:
    """The four forecast-vs-realised sections of :func:`calibration` over ``probed`` (forecast steps); the softmax
    forecast's only where some step logged it."""
    sections = {
        "same_states": _figures(probed, "first_order", "same_states"),
        "held_out": _figures(probed, "first_order", "held_out"),
    }
    softmax_same = _figures(probed, "softmax", "same_states")
    if softmax_same["forecast_steps"]:
        sections |= {"softmax_same_states": softmax_same, "softmax_held_out": _figures(probed, "softmax", "held_out")}
    return sections


def pooled(runs: list[list[Step]]) -> dict[str, dict]:
    """:func:`agreement_sections` over the forecast steps of every run given, as one series."""
    return agreement_sections([s for run in runs for s in run if s.forecast_step])


def _share(values: list[float], ok) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(map(ok, finite)) / len(finite) if finite else math.nan


def run_json(steps: list[Step]) -> dict:
    """A run's steps and figures as plain JSON (NaN as null)."""
    return _plain({"calibration": calibration(steps), "steps": [asdict(s) for s in steps]})


def figures_json(figures: dict) -> dict:
    """Figures as plain JSON (NaN as null)."""
    return _plain(figures)


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
