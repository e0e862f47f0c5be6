# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""One update's entropy-control decision from the forecast: the coefficient of the entropy's step to mix into it.

The update the controller shapes is ``Δθ(c) = Δθ_J + c · Δθ_H``: the policy-gradient step ``Δθ_J`` and the step the
same optimizer takes for the entropy's gradient ``Δθ_H`` (same preconditioner; verl's ``actor.entropy_coeff`` is
this ``c``). The forecast predicts, at E's states, in nats per token:

- ``a`` ± ``a_se``: the change of the entropy along the plain step, ``⟨∇H, Δθ_J⟩`` (or the softmax-exact predictor);
- ``b`` ± ``b_se``: the change per unit coefficient, ``⟨∇H, Δθ_H⟩``; ≥ 0 to first order when the entropy at E's
  states and the entropy the step ascends are one objective and the preconditioner is positive definite, but
  estimated from E's responses, so its sign is only known when ``b > z · b_se``.

To first order the entropy after the update is ``H + a + c · b``. The rule (:func:`choose_coefficient`):

1. ``H + a`` at or above the aim: ``c = 0``, or, with ``two_sided`` (the controller's default, ``settings.py``),
   ``c = −(H + a − aim) / (b + z · b_se)`` (a step against the entropy's gradient, clipped to ``−max_coefficient``),
   only where all of these hold, else ``c = 0``: the predicted level is above the aim beyond its own error bar
   (``H + a − z · level_se > aim``, ``level_se`` the standard error of ``H + a`` over E's responses: E's level is a
   sample (16 responses on the SmolLM2 runs), and mid-collapse two such samples of one policy differed by 1.04 nats, spec "The upper
   edge"), the sensitivity's sign is resolved positive (``b > z · b_se``) and the prediction's error bar is narrower
   than the band (``z · a_se ≤ width / 2``). A negative coefficient is the collapse's own
   direction, so every doubt gives 0 (the plain step, never a held coefficient of either sign), and the same upper
   bound of ``b`` in the denominator under-steers: to first order the entropy lands between the aim and the plain
   step's prediction, never under the aim. Why lower at all: a band has two edges, and over the four held-out
   current-stack runs with the raise-only rule 12 of the 31 steps out of the band were above it, 9 of them after a
   coefficient of 0 (spec "The upper edge");
2. below it: ``c = (aim − H − a) / (b + z · b_se)``, clipped to ``[0, max_coefficient]``, with ``aim`` the band's
   centre, or above it by the shortfall the run has measured (``aim.py``: this rule falls short of its aim by
   design). Acting from the centre, not from the lower edge: E's token entropy of one step scatters by ~0.2-0.3 nats
   around its trend at E = 16 responses (SmolLM2, ``forecast_study_runs_2026-11-28/current_30steps_collapsing``);
   a controller that waits for the lower edge holds the trend there, and that scatter puts about half of the steps
   below the band. From the centre, the trend stays near it, a scatter's width from either edge. The upper
   confidence bound of the sensitivity in the denominator shrinks ``c`` when ``b`` is uncertain:
   an error of the estimate under-steers, never overshoots by more than first order predicts;
3. a sensitivity measured to be ≤ 0 (``b ≤ −z · b_se``; ``b ≤ 0`` without an error bar): ``c = 0``, a decision,
   not a fallback: any entropy step goes the collapse's own way (on the third controlled SmolLM2 run a held 0.19 with
   ``b = −4.5 ± 0.8`` took E's entropy from 1.30 to 0.30 nats, and the run collapsed; spec "The first controlled
   runs");
4. fallback, when the forecast cannot tell: the sensitivity's sign is unresolved (``|b| ≤ z · b_se``, either sign)
   or the prediction's error bar is wider than the band (``z · a_se > width / 2``): ``c`` is ``previous``, the last
   coefficient decided (the controller keeps it across fallbacks: never raised on noise, never dropped while a
   collapse is being held), ``fallback = True``. An unresolved negative ``b`` holds too: zeroing on it had erased
   the hold in the middle of a collapse (seed 11, current stack: ``b = −4.2 ± 5.7`` zeroed a held 0.083, the next two
   unresolved updates held that 0, and the rollout entropy fell from 0.97 to 0.51; spec "The aim and a band").

Shapes: scalars (one update, E pooled). Units: nats per token for ``H``, ``a``, ``b`` (per unit coefficient), the band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Band:
    """The target band of E's token entropy, nats per token: ``[target − width / 2, target + width / 2]``."""

    target: float
    width: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target) and self.target > 0):
            raise ValueError(f"the band's target must be a positive entropy in nats, got {self.target!r}")
        if not (math.isfinite(self.width) and 0 < self.width <= 2 * self.target):
            raise ValueError(
                f"the band's width must be in (0, 2 * target = {2 * self.target}] nats, got {self.width!r}"
            )

    @property
    def low(self) -> float:
        return self.target - self.width / 2

    @property
    def high(self) -> float:
        return self.target + self.width / 2


@dataclass(frozen=True)
class Decision:
    """One update's decision and what it predicts (the ``control/*`` metrics)."""

    coefficient: float  # c: the entropy step's share in this update (< 0: a step against the entropy's gradient)
    predicted_before: float  # H + a: E's token entropy after the plain step (nats per token)
    predicted_after: float  # H + a + c · b: after the controlled step
    fallback: bool  # the forecast could not tell; c is the last decided one, held
    aim: float | None = None  # the level steered to (nats per token): the band's centre unless raised (aim.py)

    def metrics(self, band: Band) -> dict[str, float]:
        return {
            "control/target": band.target,
            "control/aim": band.target if self.aim is None else self.aim,
            "control/band_low": band.low,
            "control/band_high": band.high,
            "control/predicted_before": self.predicted_before,
            "control/predicted_after": self.predicted_after,
            "control/coefficient": self.coefficient,
            "control/fallback": float(self.fallback),
        }


def choose_coefficient(
    h: float,
    a: float,
    a_se: float,
    b: float,
    b_se: float,
    band: Band,
    max_coefficient: float,
    previous: float = 0.0,
    z: float = 2.0,
    aim: float | None = None,
    two_sided: bool = False,
    level_se: float | None = None,
) -> Decision:
    """The coefficient of the entropy step for one update (module docstring: the rule and its fallback).

    Args:
        h: E's token entropy at θ (nats per token).
        a, a_se: predicted change along the plain step and its standard error.
        b, b_se: predicted change per unit coefficient of the entropy step and its standard error.
        band: the target band.
        max_coefficient: the largest coefficient the rule may choose (≥ 0).
        previous: the last coefficient decided, not held (the fallback's value, clipped to ``max_coefficient``).
        z: standard errors that make a sign or a width resolved.
        aim: the level the rule steers to (nats per token; the band's centre when None), within the band.
        two_sided: also lower a prediction above the aim (step 1 of the module docstring); ``False``: ``c ≥ 0``.
        level_se: the standard error of the predicted level ``h + a`` over E's responses (``a_se`` when None), which
            the lowering side must clear.

    Raises:
        ValueError: a non-finite input, a negative standard error, coefficient bound or ``z``; an aim outside the
            band.
    """
    level_se = a_se if level_se is None else level_se
    for name, value in {"h": h, "a": a, "a_se": a_se, "b": b, "b_se": b_se, "level_se": level_se}.items():
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r} (a missing forecast is not a zero change)")
    if a_se < 0 or b_se < 0 or level_se < 0 or z < 0 or max_coefficient < 0 or previous < 0:
        raise ValueError(
            f"standard errors, z, max_coefficient and previous must be >= 0: a_se={a_se}, b_se={b_se}, "
            f"level_se={level_se}, z={z}, "
            f"max_coefficient={max_coefficient}, previous={previous}"
        )
    aim = band.target if aim is None else aim
    if not band.low <= aim <= band.high:
        raise ValueError(f"the aim must lie in the band [{band.low}, {band.high}], got {aim!r}")
    before = h + a
    wide = z * a_se > band.width / 2  # the prediction's error bar wider than the band: neither side acts on it
    if before >= aim:
        resolved_above = before - z * level_se > aim and b > z * b_se and not wide
        if not (two_sided and resolved_above):
            return Decision(0.0, before, before, fallback=False, aim=aim)
        coefficient = -min((before - aim) / (b + z * b_se), max_coefficient)
        return Decision(coefficient, before, before + coefficient * b, fallback=False, aim=aim)
    if b <= -z * b_se:  # measured not to raise E's entropy: any entropy step goes the collapse's way
        return Decision(0.0, before, before, fallback=False, aim=aim)
    if abs(b) <= z * b_se or wide:
        held = min(previous, max_coefficient)
        return Decision(held, before, before + held * b, fallback=True, aim=aim)
    coefficient = min(max((aim - before) / (b + z * b_se), 0.0), max_coefficient)
    return Decision(coefficient, before, before + coefficient * b, fallback=False, aim=aim)


def reactive_coefficient(
    h: float, coefficient: float, last_h: float, band: Band, step: float, max_coefficient: float
) -> tuple[float, float]:
    """TRL's adaptive entropy coefficient (``GRPOTrainer``'s ``use_adaptive_entropy``, from Skywork-OR1), written
    here from its description, once per update with the band's centre as its ``entropy_target``: the anchor that
    reacts to the entropy already measured, where :func:`choose_coefficient` decides from the forecast.

    The coefficient applied now is the current one if the previous update's entropy ``last_h`` was at or below the
    target (``inf`` before the first: nothing applied), else 0; then the coefficient moves by ``step`` toward more
    entropy while this update's ``h`` is at or below the target, toward less otherwise, within
    ``[0, max_coefficient]``.

    Returns:
        ``(applied, next_coefficient)``.
    """
    for name, value in {"h": h, "coefficient": coefficient, "step": step}.items():
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if step <= 0 or coefficient < 0 or max_coefficient < 0:
        raise ValueError(
            f"step must be > 0, coefficient and max_coefficient >= 0: {step}, {coefficient}, {max_coefficient}"
        )
    applied = coefficient if last_h <= band.target else 0.0
    moved = coefficient + step if h <= band.target else coefficient - step
    return applied, min(max(moved, 0.0), max_coefficient)
