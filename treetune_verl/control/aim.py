# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Where the rule steers: the band's centre, raised by the shortfall the run has measured (integral action).

The rule (``rule.py``) aims each update at a level and falls short of it by construction: it shrinks the coefficient
by the sensitivity's error bar (``b + z · b_se``), the trust region caps it, and it never acts above the aim. On the
held-out SmolLM2 runs of issue 46 (seed 7) the shortfall ``control/target − control/predicted_after`` was
positive on every acting update of both stacks (median 0.16 nats current, 0.12 pinned), and over steps 19-30 the
rollout entropy sat 0.21 (current) and 0.07 (pinned) nats under the centre: the run's scatter then puts the low steps
out of the band (4 of the current run's 7 out-of-band steps were under it, two of them at steps 27-28). A fixed aim
above the centre would guess the shortfall; integral action measures it:

    offset_t = clip(offset_{t−1} + gain · (target − h_t), 0, width / 4),     aim_t = target + offset_t

with ``h_t`` E's token entropy at θ_t (nats per token), measured before the update decides. While the run sits under
the centre the offset grows, and the next decisions aim higher; above the centre it shrinks. Why it cannot run away:

- clipped to ``[0, width / 4]``: the aim stays between the centre and the middle of the band's upper half, so a
  biased aim moves the trend at most a quarter width, never to the edge; the clip is the anti-windup (a collapse held
  for many steps cannot store more than the clip, the early steps above the centre store nothing below 0);
- ``gain · (target − h)`` per update: E's scatter of ~0.15 nats moves the aim by ``gain`` times that per update, and
  the rule's own safeguards (fallback on a wide error bar, the trust region) act on the aimed coefficient as before;
- ``gain = 0`` is the rule without it.

On the held-out runs since (seeds 11, 13; spec "The aim and a band from the first updates") the offset reached its
clip at updates 14 and 17 and the trend still sat under the centre: where the trust region caps the coefficient, the
aim does not decide.
"""

from __future__ import annotations

import math

from treetune_verl.control.rule import Band


class IntegralAim:
    """The aim over one run's updates (module docstring); :meth:`aim` once per update, before the rule."""

    def __init__(self, gain: float) -> None:
        if not (math.isfinite(gain) and 0 <= gain <= 1):
            raise ValueError(f"the aim's integral gain must be in [0, 1], got {gain!r}")
        self.gain = gain
        self.offset = 0.0  # nats per token, in [0, width / 4]

    def aim(self, h: float, band: Band) -> float:
        """This update's aim (nats per token) from E's token entropy ``h`` at θ and the band."""
        if not math.isfinite(h):
            raise ValueError(f"h must be finite, got {h!r} (a missing entropy is not a measured shortfall)")
        self.offset = min(max(self.offset + self.gain * (band.target - h), 0.0), band.width / 4)
        return band.target + self.offset
