# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The on-policy gain κ: how much more E's token entropy moves from one update to the next than the forecast says.

The forecast and the controller's sensitivity are E's entropy at fixed states (E's responses, sampled before the
update). The band is on the entropy the policy samples: after the update it samples other responses (shorter or
longer, other tokens), and that moves the entropy too. On the first controlled SmolLM2 run (issue 46; spec
"The first controlled run") the change from one update's E to the next update's was 2-3x the fixed-state prediction,
in both directions (verl's step alone and with the controller's): a controller aiming at the band's centre from the
fixed-state prediction overshot it by that factor. This module measures the factor on the run itself.

Per update t, ``p_t`` = the fixed-state prediction of the change over the update (``a + c · b``, nats per token) and
``h_t`` = E's token entropy before it. With the observed change ``o_t = h_{t+1} − h_t``, least squares through the
origin, shrunk toward the prior κ₀ = 2 by ``prior_weight`` (nats², about one step's ``p²``: one step with a small
``p`` and E's sampling noise of 0.15-0.3 nats cannot swing it):

    κ = (prior_weight · κ₀ + Σ o_t p_t) / (prior_weight + Σ p_t²),   clipped to [1, max_gain]

κ₀ from the forecast study, not from the controlled runs: over the instrumented SmolLM2 collapse the token entropy
changed by −1.49 nats on-policy and −0.78 at fixed states, 1.9x (``2026-11-28-forecast-calibration.md``, "Fixed
states vs the policy's own distribution").

Never below 1: a gain under 1 would enlarge the controller's step on noise. The controller scales the forecast's
``a`` and ``b`` (and their standard errors) by κ before its rule (``controller.py``).
"""

from __future__ import annotations

import math

PRIOR_GAIN = 2.0
PRIOR_WEIGHT = 0.05  # nats²
MAX_GAIN = 4.0


class OnPolicyGain:
    """κ over one run's updates (module docstring); call :meth:`observe` with each update's ``h`` before deciding,
    then :meth:`predicted` with the update's fixed-state prediction."""

    def __init__(
        self, prior_gain: float = PRIOR_GAIN, prior_weight: float = PRIOR_WEIGHT, max_gain: float = MAX_GAIN
    ) -> None:
        if not (prior_weight > 0 and 1 <= prior_gain <= max_gain):
            raise ValueError(
                f"prior_weight must be > 0 and 1 <= prior_gain <= max_gain, got {prior_weight}, {prior_gain}, {max_gain}"
            )
        self.prior_gain, self.prior_weight, self.max_gain = prior_gain, prior_weight, max_gain
        self.pairs = 0
        self._sum_op = self._sum_pp = 0.0
        self._last: tuple[float, float] | None = None

    def observe(self, h: float) -> None:
        """E's token entropy before this update: the previous update's observed change, paired with its prediction."""
        if not math.isfinite(h):
            raise ValueError(f"h must be finite, got {h!r}")
        if self._last is not None:
            h_before, p = self._last
            self._sum_op += (h - h_before) * p
            self._sum_pp += p * p
            self.pairs += 1
        self._last = None

    def predicted(self, h: float, p: float) -> None:
        """This update's ``h`` and its fixed-state prediction ``p`` (nats per token), paired at the next
        :meth:`observe`."""
        if not (math.isfinite(h) and math.isfinite(p)):
            raise ValueError(f"h and p must be finite, got {h!r}, {p!r}")
        self._last = (h, p)

    @property
    def gain(self) -> float:
        raw = (self.prior_weight * self.prior_gain + self._sum_op) / (self.prior_weight + self._sum_pp)
        return min(max(raw, 1.0), self.max_gain)
