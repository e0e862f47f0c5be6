# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The aim's integral action (``aim.py``) and the band from the first updates (``Controller._band``), counted by hand."""

from __future__ import annotations

import math

import pytest

from treetune_verl.control.aim import IntegralAim
from treetune_verl.control.controller import Controller
from treetune_verl.control.rule import Band
from treetune_verl.control.settings import ControlSettings


def test_the_aim_integrates_the_shortfall_within_a_quarter_width():
    band = Band(1.0, 0.8)  # the offset is clipped to [0, 0.2]
    aim = IntegralAim(gain=0.2)
    # above the centre stores nothing below 0; under it the offset grows by 0.2 x the shortfall; above it shrinks
    entropies = [1.5, 0.8, 0.9, 0.6, 1.4, 1.0]
    expected = [1.0, 1.04, 1.06, 1.14, 1.06, 1.06]
    assert [aim.aim(h, band) for h in entropies] == pytest.approx(expected)
    # a collapse held for many updates stores no more than the clip (anti-windup): one update above the centre
    # brings the aim down at once
    assert [aim.aim(0.2, band) for _ in range(5)] == pytest.approx([1.2] * 5)
    assert aim.aim(1.3, band) == pytest.approx(1.14)
    # gain 0: the band's centre, whatever the run measured
    off = IntegralAim(gain=0.0)
    assert [off.aim(h, band) for h in entropies] == [1.0] * len(entropies)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"integral gain must be in \[0, 1\]"):
        IntegralAim(gain=1.5)
    with pytest.raises(ValueError, match="a missing entropy is not a measured shortfall"):
        IntegralAim(gain=0.2).aim(math.nan, Band(1.0, 0.8))


def test_a_fractions_band_is_the_share_of_the_first_updates_mean_then_fixed():
    controller = Controller(ControlSettings(0.4, target_fraction=0.5, reference_updates=3))
    centres = [controller._band(h).target for h in (1.6, 1.2, 1.4, 0.2, 3.0)]
    assert centres == pytest.approx([0.8, 0.7, 0.7, 0.7, 0.7])  # 0.5 x the mean of 1.6, 1.2, 1.4 from the third
    one = Controller(ControlSettings(0.4, target_fraction=0.5, reference_updates=1))
    assert [one._band(h).target for h in (1.6, 1.2)] == pytest.approx([0.8, 0.8])  # the first update's alone
    fixed = Controller(ControlSettings(0.4, target=1.1))
    assert [fixed._band(h).target for h in (1.6, 0.2)] == [1.1, 1.1]
    # a reference mean under width / 2 leaves no band: refused by name
    with pytest.raises(ValueError, match="band's width"):
        Controller(ControlSettings(1.0, target_fraction=0.5))._band(0.8)
