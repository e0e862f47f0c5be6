# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``control/on_policy_gain.py``: κ, the observed change of E's entropy over the fixed-state prediction, least squares
through the origin shrunk toward 1, against the sums written out here."""

from __future__ import annotations

import math

import pytest

from treetune_verl.control.on_policy_gain import MAX_GAIN, PRIOR_GAIN, PRIOR_WEIGHT, OnPolicyGain


def test_the_gain_is_the_shrunk_least_squares_ratio_of_observed_to_predicted():
    # E's entropy before each update and each update's fixed-state prediction p; the observed changes are 3 p
    hs = [1.8, 1.5, 1.8, 1.2]
    ps = [-0.1, 0.1, -0.2]
    gain = OnPolicyGain()
    assert gain.gain == PRIOR_GAIN == 2.0 and gain.pairs == 0  # nothing observed: the prior
    for i, h in enumerate(hs):
        gain.observe(h)
        if i < len(ps):
            gain.predicted(h, ps[i])
    o = [b - a for a, b in zip(hs, hs[1:], strict=False)]
    assert o == pytest.approx([3 * p for p in ps])
    observed = sum(x * p for x, p in zip(o, ps, strict=True))
    expected = (PRIOR_WEIGHT * PRIOR_GAIN + observed) / (PRIOR_WEIGHT + sum(p * p for p in ps))
    assert gain.pairs == 3 and gain.gain == pytest.approx(expected) and 2 < gain.gain < 3  # shrunk toward the prior


def test_the_gain_stays_within_one_and_its_bound():
    falls_less = OnPolicyGain()  # changes a tenth of the predicted ones: below 1 would enlarge the controller's steps
    falls_less.predicted(1.0, -0.4)
    falls_less.observe(0.96)
    assert falls_less.gain == 1.0
    runaway = OnPolicyGain()
    runaway.predicted(1.0, 0.1)
    runaway.observe(3.0)  # 20x
    assert runaway.gain == MAX_GAIN
    unpaired = OnPolicyGain()  # an update without a prediction (no control decision) pairs nothing
    unpaired.observe(1.0)
    unpaired.observe(2.0)
    assert unpaired.pairs == 0 and unpaired.gain == PRIOR_GAIN


def test_bad_input_is_refused():
    gain = OnPolicyGain()
    with pytest.raises(ValueError, match="h must be finite"):
        gain.observe(math.nan)
    with pytest.raises(ValueError, match="must be finite"):
        gain.predicted(1.0, math.inf)
    with pytest.raises(ValueError, match="prior_weight must be > 0"):
        OnPolicyGain(prior_weight=0.0)
    with pytest.raises(ValueError, match="prior_gain <= max_gain"):
        OnPolicyGain(prior_gain=5.0)
