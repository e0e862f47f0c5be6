# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The controller's settings: ``actor_rollout_ref.rollout.custom.entropy_control``, read and checked in the actor.

Keys (nats per token for entropies):

    target: float > 0          the band's centre in nats, or
    target_fraction: float     the band's centre as a share in (0, 1] of E's token entropy over the first
                               ``reference_updates`` controlled updates (exactly one of the two)
    reference_updates: int     ``target_fraction`` only: how many first updates' E entropies the band's centre is
                               the share of (>= 1; 3): one step's E scatters by 0.15-0.3 nats (two starts of one
                               SmolLM2 command set centres 0.22 nats apart from one each); until the last of them
                               the band is the share of the mean so far
    width: float > 0           the band's width in nats (≤ 2 · target; with ``target_fraction`` checked at the first
                               update)
    max_coefficient: float     the largest coefficient of the entropy step (> 0; 1.0): a weight on the entropy as
                               on a loss term, the step taken by the optimizer's own preconditioner
                               (``adam_sensitivity.py``)
    z: float >= 0              standard errors that make a sign or the band's width resolved (2.0; ``rule.py``)
    max_step_ratio: float      the controller's step at most this share of verl's own step (> 0; 1.0):
                               ``c · ‖Δθ_H‖ ≤ max_step_ratio · ‖Δθ‖``, the region where the forecast's first order was
                               measured (verl's own steps); larger steps preceded the collapse the controller caused
                               on its third SmolLM2 run (2.9x and 6.7x verl's)
    rule: str                  ``forecast`` (default: the coefficient solved from the forecast, ``rule.py``) or
                               ``reactive``: TRL's adaptive entropy coefficient (Skywork-OR1; ``rule.reactive``),
                               the anchor of issue 46's study, through the same entropy step
    integral_gain: float       ``forecast`` only: the aim's integral action (in [0, 1]; 0.2; 0 off): the rule aims
                               above the band's centre by the shortfall measured so far, at most width / 4
                               (``aim.py``)
    two_sided: bool            ``forecast`` only: the rule also lowers a prediction resolved above the aim toward
                               it (a negative coefficient, ``rule.py``; true); false: the raise-only rule (a floor)
    coefficient_step: float    ``reactive`` only: the coefficient's change per update (> 0; TRL's
                               ``entropy_coef_delta``, 0.005), up while E's entropy is at or below the band's
                               centre, down otherwise, within ``[0, max_coefficient]``

The section runs only with the forecast (``custom.entropy_forecast``, central differences: ``method`` auto in
float32 or ``central_difference``): it decides at the forecast's first optimizer step of each forecast update. An
absent or null section turns it off; anything else wrong raises ``ValueError`` naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from treetune_verl.config.keys import check_known_keys, plain
from treetune_verl.rollout.rollout_config import read_key

SECTION = "actor_rollout_ref.rollout.custom.entropy_control"
KEYS = (
    "target",
    "target_fraction",
    "reference_updates",
    "width",
    "max_coefficient",
    "z",
    "max_step_ratio",
    "rule",
    "coefficient_step",
    "integral_gain",
    "two_sided",
)
RULES = ("forecast", "reactive")
INTEGRAL_GAIN = 0.2  # the forecast rule's default (aim.py); the reactive rule has none
REFERENCE_UPDATES = 3  # target_fraction's default


@dataclass(frozen=True)
class ControlSettings:
    """``custom.entropy_control``, checked (module docstring)."""

    width: float
    target: float | None = None
    target_fraction: float | None = None
    max_coefficient: float = 1.0
    z: float = 2.0
    max_step_ratio: float = 1.0
    rule: str = "forecast"
    coefficient_step: float | None = None  # reactive only
    integral_gain: float = INTEGRAL_GAIN  # the forecast rule's (0 with rule=reactive: TRL's rule has none)
    reference_updates: int = REFERENCE_UPDATES  # target_fraction's (unused with target)
    two_sided: bool = True  # the forecast rule's (False with rule=reactive: TRL's coefficient is >= 0)


def _number(section: Mapping, key: str, default: float | None) -> float | None:
    value = section.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{SECTION}.{key} must be a finite number, got {value!r}")
    return float(value)


def _refuse_with_another_rule(key: str, value: Any, owner: str, rule: str) -> None:
    """Raise when ``key``, a setting of the ``owner`` rule only, is given (``value`` not None) with another rule."""
    if rule != owner and value is not None:
        raise ValueError(f"{SECTION}.{key} is the {owner} rule's (rule={owner}), got rule={rule!r}")


def control_settings(rollout_config: Any) -> ControlSettings | None:
    """``ControlSettings`` from a rollout config (DictConfig, dict or verl's ``RolloutConfig``), or ``None`` (off).

    Raises:
        ValueError: an unknown key or a bad value, naming ``actor_rollout_ref.rollout.custom.entropy_control.<key>``;
            the section without the forecast's.
    """
    custom = read_key(rollout_config, "custom")
    section = plain(read_key(custom, "entropy_control"))
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ValueError(f"{SECTION} must be a mapping of {sorted(KEYS)}, got {section!r}")
    check_known_keys(section, KEYS, SECTION)
    if plain(read_key(custom, "entropy_forecast")) is None:
        raise ValueError(
            f"{SECTION} decides from the forecast: it needs actor_rollout_ref.rollout.custom.entropy_forecast "
            "(+treetune_forecast=entropy_forecast)"
        )
    target, fraction = _number(section, "target", None), _number(section, "target_fraction", None)
    if (target is None) == (fraction is None):
        raise ValueError(f"{SECTION}: give exactly one of target (nats) and target_fraction, got {dict(section)}")
    if target is not None and target <= 0:
        raise ValueError(f"{SECTION}.target must be > 0 nats, got {target}")
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"{SECTION}.target_fraction must be in (0, 1], got {fraction}")
    width = _number(section, "width", None)
    if width is None or width <= 0 or (target is not None and width > 2 * target):
        bound = f"(0, 2 * target = {2 * target}]" if target is not None else "> 0"
        raise ValueError(f"{SECTION}.width must be {bound} nats, got {section.get('width')!r}")
    max_coefficient = _number(section, "max_coefficient", 1.0)
    if max_coefficient <= 0:
        raise ValueError(f"{SECTION}.max_coefficient must be > 0, got {max_coefficient}")
    z = _number(section, "z", 2.0)
    if z < 0:
        raise ValueError(f"{SECTION}.z must be >= 0, got {z}")
    max_step_ratio = _number(section, "max_step_ratio", 1.0)
    if max_step_ratio <= 0:
        raise ValueError(f"{SECTION}.max_step_ratio must be > 0, got {max_step_ratio}")
    rule = section.get("rule", "forecast")
    if rule not in RULES:
        raise ValueError(f"{SECTION}.rule must be one of {list(RULES)}, got {rule!r}")
    coefficient_step = _number(section, "coefficient_step", 0.005 if rule == "reactive" else None)
    _refuse_with_another_rule("coefficient_step", coefficient_step, "reactive", rule)
    if coefficient_step is not None and coefficient_step <= 0:
        raise ValueError(f"{SECTION}.coefficient_step must be > 0, got {coefficient_step}")
    integral_gain = _number(section, "integral_gain", None)
    _refuse_with_another_rule("integral_gain", integral_gain, "forecast", rule)
    if integral_gain is not None and not 0 <= integral_gain <= 1:
        raise ValueError(f"{SECTION}.integral_gain must be in [0, 1], got {integral_gain}")
    two_sided = section.get("two_sided")
    _refuse_with_another_rule("two_sided", two_sided, "forecast", rule)
    if two_sided is not None and not isinstance(two_sided, bool):
        raise ValueError(f"{SECTION}.two_sided must be true or false, got {two_sided!r}")
    reference_updates = section.get("reference_updates")
    if fraction is None and reference_updates is not None:
        raise ValueError(f"{SECTION}.reference_updates sets the centre from target_fraction; with target it is fixed")
    if reference_updates is not None and (
        isinstance(reference_updates, bool) or not isinstance(reference_updates, int) or reference_updates < 1
    ):
        raise ValueError(f"{SECTION}.reference_updates must be an integer >= 1, got {reference_updates!r}")
    return ControlSettings(
        width,
        target,
        fraction,
        max_coefficient,
        z,
        max_step_ratio,
        rule,
        coefficient_step,
        (INTEGRAL_GAIN if rule == "forecast" else 0.0) if integral_gain is None else integral_gain,
        REFERENCE_UPDATES if reference_updates is None else reference_updates,
        rule == "forecast" if two_sided is None else two_sided,
    )
