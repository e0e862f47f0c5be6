# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``custom.entropy_control``: read into ``ControlSettings``, every bad value refused by name (the typo check of the
whole ``custom`` tree is ``trainer/test_custom_keys_on_cpu.py``'s)."""

from __future__ import annotations

import pytest

from treetune_verl.control.settings import SECTION, ControlSettings, control_settings

FORECAST = {"every": 1}


def _rollout(control, forecast=FORECAST) -> dict:
    custom = {"entropy_control": control}
    if forecast is not None:
        custom["entropy_forecast"] = forecast
    return {"custom": custom}


def test_read_with_defaults_and_off_when_absent():
    assert control_settings({"custom": {"entropy_forecast": FORECAST}}) is None
    assert control_settings(_rollout(None)) is None
    assert control_settings(_rollout({"target": 1.2, "width": 0.4})) == ControlSettings(0.4, target=1.2)
    got = control_settings(_rollout({"target_fraction": 0.8, "width": 0.5, "max_coefficient": 3, "z": 1}))
    assert got == ControlSettings(0.5, target_fraction=0.8, max_coefficient=3.0, z=1.0)
    assert (got.integral_gain, got.reference_updates) == (0.2, 3)  # the aim's integral action, a 3-update centre
    given = control_settings(_rollout({"target_fraction": 0.8, "width": 0.5, "reference_updates": 1}))
    assert given.reference_updates == 1
    assert control_settings(_rollout({"target": 1.0, "width": 0.4, "integral_gain": 0})).integral_gain == 0.0
    # the reactive anchor: TRL's step per update unless given
    reactive = control_settings(_rollout({"target": 1.0, "width": 0.4, "rule": "reactive"}))
    assert (reactive.rule, reactive.coefficient_step, reactive.integral_gain) == ("reactive", 0.005, 0.0)
    given = control_settings(_rollout({"target": 1.0, "width": 0.4, "rule": "reactive", "coefficient_step": 0.02}))
    assert given.coefficient_step == 0.02
    assert reactive.max_step_ratio == 1.0  # the trust region's default: verl's own step
    # the forecast rule holds both edges unless told to be a floor; TRL's coefficient never goes below 0
    assert got.two_sided and not reactive.two_sided
    assert not control_settings(_rollout({"target": 1.0, "width": 0.4, "two_sided": False})).two_sided
    assert control_settings(_rollout({"target": 1.0, "width": 0.4, "max_step_ratio": 2})).max_step_ratio == 2.0


BAD = [
    ({"target": 1.0, "width": 0.4}, None, "needs actor_rollout_ref.rollout.custom.entropy_forecast"),
    ({"target": 1.0, "target_fraction": 0.5, "width": 0.4}, FORECAST, "exactly one of target"),
    ({"width": 0.4}, FORECAST, "exactly one of target"),
    ({"target": -1.0, "width": 0.4}, FORECAST, r"target must be > 0"),
    ({"target_fraction": 1.5, "width": 0.4}, FORECAST, r"target_fraction must be in \(0, 1\]"),
    ({"target": 1.0, "width": 2.5}, FORECAST, r"width must be \(0, 2 \* target = 2.0\]"),
    ({"target": 1.0}, FORECAST, "width must be"),
    ({"target": 1.0, "width": 0.4, "max_coefficient": 0}, FORECAST, "max_coefficient must be > 0"),
    ({"target": 1.0, "width": 0.4, "z": -1}, FORECAST, "z must be >= 0"),
    ({"target": "1.0", "width": 0.4}, FORECAST, "target must be a finite number"),
    ({"target": 1.0, "width": 0.4, "widht": 0.3}, FORECAST, "widht: unknown key; did you mean 'width'"),
    ({"target": 1.0, "width": 0.4, "max_step_ratio": 0}, FORECAST, "max_step_ratio must be > 0"),
    ({"target": 1.0, "width": 0.4, "rule": "pid"}, FORECAST, r"rule must be one of \['forecast', 'reactive'\]"),
    ({"target": 1.0, "width": 0.4, "coefficient_step": 0.01}, FORECAST, "coefficient_step is the reactive rule's"),
    ({"target": 1.0, "width": 0.4, "rule": "reactive", "coefficient_step": 0}, FORECAST, "coefficient_step must be"),
    ({"target": 1.0, "width": 0.4, "rule": "reactive", "integral_gain": 0.2}, FORECAST, "integral_gain is the forec"),
    ({"target": 1.0, "width": 0.4, "integral_gain": 1.5}, FORECAST, r"integral_gain must be in \[0, 1\]"),
    ({"target": 1.0, "width": 0.4, "rule": "reactive", "two_sided": True}, FORECAST, "two_sided is the forecast ru"),
    ({"target": 1.0, "width": 0.4, "two_sided": "yes"}, FORECAST, "two_sided must be true or false"),
    ({"target": 1.0, "width": 0.4, "two_sided": 1}, FORECAST, "two_sided must be true or false"),
    ({"target": 1.0, "width": 0.4, "reference_updates": 3}, FORECAST, "reference_updates sets the centre from"),
    ({"target_fraction": 0.8, "width": 0.4, "reference_updates": 0}, FORECAST, "reference_updates must be an int"),
    ({"target_fraction": 0.8, "width": 0.4, "reference_updates": 2.5}, FORECAST, "reference_updates must be an int"),
]


@pytest.mark.parametrize(("section", "forecast", "message"), BAD)
def test_bad_values_are_refused_by_name(section, forecast, message):
    with pytest.raises(ValueError, match=message) as raised:
        control_settings(_rollout(section, forecast))
    assert SECTION in str(raised.value)
