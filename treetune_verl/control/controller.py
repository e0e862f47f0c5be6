# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The controller inside the forecast's first optimizer step: measure, decide, apply (issue 46).

The forecast (``forecast/live.py``, ``ForecastRun``) calls a :class:`Controller` twice in the update's first optimizer
step, θ -> θ′ (verl's own step):

1. :meth:`Controller.after_verl_step`, right after verl's step while ``.grad`` still holds the gradient it used: the
   optimizer's sensitivity ``k`` (``adam_sensitivity.step_sensitivity``);
2. :meth:`Controller.decide_and_apply`, once the forecast's forwards are done and θ′ is restored: the entropy step and
   ``b ± b_se`` (``sensitivity.measure``, on a copy of θ′), the decision (``rule.choose_coefficient``), and
   θ′ + c · Δθ_H written into the parameters from that copy (``WeightsAroundStep.displace``, then ``keep``).

The rule's inputs, all of E's responses at fixed states, pooled over the ranks (every rank decides the same ``c``):
``h`` = E's token entropy at θ, ``a`` = its change over verl's step, measured at θ′ by the forecast's forward (the
whole step, every order: not a prediction), with the paired standard error over E's responses. So the prediction
``H + a + c · b`` is first order in the controller's own step only, the step ``b`` is measured along at its own scale.
With more than one optimizer step in the update the later ones are verl's alone (decided at the first; the next
forecast sees their effect).

The band is on the entropy the policy samples, the forecast at E's fixed states: before the rule, ``a`` and ``b`` are
scaled by the on-policy gain κ the run's own updates measured (``on_policy_gain.py``; 1 until they say more).

With ``rule: reactive`` (issue 46's anchor) the decision is TRL's adaptive coefficient from the entropy measured
(``rule.reactive_coefficient``), through the same entropy step: the study compares the two rules on one actuator.

The forecast rule steers to an aim (``aim.py``): the band's centre, raised by the shortfall the run has measured.

State across updates (one ``Controller`` per actor worker, kept in the forecast's state): the last coefficient decided
(the rule's fallback holds it), the aim's offset, and the band, resolved over the first ``reference_updates`` updates
when the target is a fraction of E's entropy (the share of their mean; fixed from then on).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from treetune_verl.control.adam_sensitivity import step_sensitivity
from treetune_verl.control.aim import IntegralAim
from treetune_verl.control.on_policy_gain import OnPolicyGain
from treetune_verl.control.rule import Band, Decision, choose_coefficient, reactive_coefficient
from treetune_verl.control.sensitivity import measure, secant
from treetune_verl.control.settings import ControlSettings, control_settings
from treetune_verl.forecast.step_weights import WeightsAroundStep
from treetune_verl.forecast.token_entropy import TokenEntropyStats, ratio_and_se, ratio_moments
from treetune_verl.probe.components import ProbeComponents

PREFIX = "control/"
# The standard error the rule gets where there is none (fewer than two responses on every rank): it falls back.
UNRESOLVED = 1e300


class Controller:
    """One actor worker's controller (module docstring); ``moved`` after :meth:`decide_and_apply`: whether the
    update's weights were changed (the forecast then measures the realised change after the whole update)."""

    def __init__(self, settings: ControlSettings) -> None:
        self.settings = settings
        self.band: Band | None = None
        self._reference: list[float] = []  # E's token entropy at the first updates (target_fraction's centre)
        self.integral = IntegralAim(settings.integral_gain)  # the forecast rule's aim
        self.previous = 0.0
        self.moved = False
        # the reactive rule's state (settings.rule == "reactive"): its coefficient and the previous update's entropy
        self._reactive_coefficient, self._last_h = 0.0, math.inf
        self.gain = OnPolicyGain()  # the forecast rule's κ, measured on the run's own updates
        self._k: dict[torch.Tensor, torch.Tensor] | None = None
        self._held_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._predicted_change = 0.0

    def after_verl_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Right after verl's first optimizer step of the update: the step's sensitivity to an added gradient."""
        self._k = step_sensitivity(optimizer)
        self.moved = False

    def _band(self, h: float) -> Band:
        """The band of this update: ``target``'s, or ``target_fraction`` of the mean of E's token entropy over the
        first ``reference_updates`` updates (the mean so far until then; ``h`` is this update's)."""
        s = self.settings
        if s.target is not None:
            self.band = self.band or Band(s.target, s.width)
        elif len(self._reference) < s.reference_updates:
            self._reference.append(h)
            # refuses a width above 2 · target (a fraction's, checked here)
            self.band = Band(s.target_fraction * sum(self._reference) / len(self._reference), s.width)
        return self.band

    def decide_and_apply(
        self,
        components: ProbeComponents,
        E: dict[str, torch.Tensor],
        mb_size_prompts: int,
        token: TokenEntropyStats,
        step_norm: float,
        sum_over_ranks: Callable[[torch.Tensor], torch.Tensor],
    ) -> dict[str, float]:
        """With the parameters at θ′ (verl's step, the forecast done): measure, decide, apply; the ``control/*``
        metrics. ``token``: the forecast's per-response sums of E (this rank's); ``step_norm``: ‖Δθ‖ over the ranks."""
        if self._k is None:
            raise RuntimeError("Controller.decide_and_apply before after_verl_step")
        h, _ = ratio_and_se(sum_over_ranks(ratio_moments(token.h_before, token.tokens)))
        a, a_se = ratio_and_se(sum_over_ranks(ratio_moments(token.first_step, token.tokens)))
        # half B's responses (odd prompts, each G of them, in E's order): where b is measured and the realised change
        # of the controller's step is read (half A's own entropy rises by far more than b says: its step ascends it)
        G = int(E["sequences"].shape[1])
        held_out = (torch.arange(token.tokens.numel()) // G) % 2 == 1
        self._held_out = (held_out, token.tokens[held_out], (token.h_before + token.first_step)[held_out])
        band = self._band(h)
        aim = self.integral.aim(h, band) if self.settings.rule == "forecast" else band.target
        self.gain.observe(h)
        kappa = self.gain.gain  # the fixed-state forecast scaled to the entropy the policy will sample
        # the predicted level's own standard error over E's responses (E's level is a sample: the lowering side must
        # clear it, rule.py)
        _, level_se = ratio_and_se(
            sum_over_ranks(ratio_moments(token.h_before + kappa * token.first_step, token.tokens))
        )

        def decide(b: float, b_se: float, bound: float) -> Decision:
            return choose_coefficient(
                h,
                kappa * a,
                kappa * a_se if math.isfinite(a_se) else UNRESOLVED,
                kappa * b,
                kappa * b_se if math.isfinite(b_se) else UNRESOLVED,
                band,
                bound,
                self.previous,
                self.settings.z,
                aim,
                self.settings.two_sided,
                level_se if math.isfinite(level_se) else UNRESOLVED,
            )

        weights = WeightsAroundStep(components)  # a copy of θ′ for the entropy step's forwards
        try:
            sensitivity = measure(components, E, mb_size_prompts, self._k, weights, step_norm, sum_over_ranks)
            b, b_se = sensitivity.b, sensitivity.b_se
            # the trust region: the controller's step at most max_step_ratio of verl's (settings.py)
            bound = min(self.settings.max_coefficient, self._step_bound(sensitivity.norm, step_norm))
            decision = decide(b, b_se, bound) if self.settings.rule == "forecast" else self._react(h, a, b, band, bound)
            if decision.coefficient != 0 and self.settings.rule == "forecast":
                # the rule's step measured whole: the secant over it, then the rule again
                at_prime = (self._held_out[1], self._held_out[2])
                args = (components, E, mb_size_prompts, sensitivity.entropy_step, decision.coefficient, weights)
                b, b_se = secant(*args, at_prime, sum_over_ranks)
                decision = decide(b, b_se, bound)
            if decision.coefficient != 0:  # θ′ + c · Δθ_H written from the copy of θ′, and kept
                weights.displace(sensitivity.entropy_step, decision.coefficient)
                weights.keep()
                self.moved = True
        finally:
            weights.restore()  # θ′ unless the step was kept
        self._remember(decision)
        self._k = None
        self._predicted_change = decision.coefficient * b  # at E's fixed states: what the held-out half measures
        self.gain.predicted(h, a + self._predicted_change)
        norm = sensitivity.norm
        return {
            **decision.metrics(band),
            PREFIX + "H_before": h,
            PREFIX + "change_plain": a,
            PREFIX + "change_plain_se": a_se,
            PREFIX + "predicted_before_se": level_se,  # of H + κ a over E's responses
            PREFIX + "b_slope": sensitivity.b,  # at θ′ (central difference)
            PREFIX + "b_slope_se": sensitivity.b_se,
            PREFIX + "b": b,  # what the decision used: the secant over the step when the rule acts, else the slope
            PREFIX + "b_se": b_se,
            PREFIX + "entropy_step_ratio": abs(decision.coefficient) * norm / step_norm if step_norm > 0 else math.nan,
            PREFIX + "coefficient_bound": bound,  # max_coefficient, or the trust region's when smaller
            PREFIX + "on_policy_gain": kappa,  # κ: predicted_before / _after are H + κ a (+ κ c b)
            PREFIX + "on_policy_pairs": float(self.gain.pairs),
        }

    def _remember(self, decision: Decision) -> None:
        """Keep the coefficient the fallback holds: the last one decided (a held one, clipped by a smaller trust
        region or held at nothing, would erode the hold over a run of fallbacks), 0 after a lowering one: the hold
        keeps a collapse held, and a negative coefficient held under the aim would push the entropy the collapse's
        way."""
        if not decision.fallback:
            self.previous = max(decision.coefficient, 0.0)

    def _step_bound(self, entropy_step_norm: float, step_norm: float) -> float:
        """The largest coefficient whose step ``c · Δθ_H`` is at most ``max_step_ratio`` of verl's ``Δθ`` (norms over
        the ranks); 0 when the entropy's step is zero or not finite."""
        if not (math.isfinite(entropy_step_norm) and entropy_step_norm > 0 and math.isfinite(step_norm)):
            return 0.0
        return self.settings.max_step_ratio * step_norm / entropy_step_norm

    def _react(self, h: float, a: float, b: float, band: Band, bound: float) -> Decision:
        """The reactive anchor (``rule.reactive_coefficient``): the coefficient from the entropy measured, the
        forecast's ``a`` and ``b`` only logged beside it (``predicted_after``: what the forecast says it will do);
        the trust region's ``bound`` caps what is applied, as for the forecast rule (one actuator, one limit)."""
        s = self.settings
        applied, self._reactive_coefficient = reactive_coefficient(
            h, self._reactive_coefficient, self._last_h, band, s.coefficient_step, s.max_coefficient
        )
        self._last_h = h
        applied = min(applied, bound)
        return Decision(applied, h + a, h + a + applied * b, fallback=False)

    def realised(
        self, after: tuple[torch.Tensor, torch.Tensor], sum_over_ranks: Callable[[torch.Tensor], torch.Tensor]
    ) -> dict[str, float]:
        """After the whole update: ``control/realised_heldout(_se)``, E's held-out half's token entropy after it minus at
        θ′ (the controller's step and verl's later ones), beside ``control/predicted_change`` (``c · b``).
        ``after``: per response of this rank, ``(tokens, Σ_k H_k)`` ``[B, G]`` after the update."""
        held_out, tokens, at_prime = self._held_out
        _, h_after = after
        change = h_after.flatten()[held_out] - at_prime
        value, se = ratio_and_se(sum_over_ranks(ratio_moments(change, tokens)))
        out = {PREFIX + "realised_heldout": value, PREFIX + "predicted_change": self._predicted_change}
        if math.isfinite(se):
            out[PREFIX + "realised_heldout_se"] = se
        return out


SETTINGS_ATTR = "_treetune_control_settings"  # on verl's actor worker: the section, read at its first update


def attach(worker: Any, state: Any) -> Controller | None:
    """The worker's :class:`Controller`, kept on the forecast's ``state`` (``ForecastState.controller``) for the
    forecast to call, or None (``custom.entropy_control`` absent). The section is read from the worker's
    ``config.rollout`` at its first update and kept (the trainer's process checked it at start-up)."""
    if SETTINGS_ATTR not in vars(worker):
        vars(worker)[SETTINGS_ATTR] = control_settings(worker.config.rollout)
    settings = vars(worker)[SETTINGS_ATTR]
    if settings is None:
        state.controller = None
    elif state.controller is None or state.controller.settings != settings:
        state.controller = Controller(settings)
    return state.controller
