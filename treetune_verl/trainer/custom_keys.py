# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every key of our sections under verl's ``actor_rollout_ref.rollout.custom``, checked at start-up.

verl's ``custom`` is an open mapping (its extension point in ``RolloutConfig``): verl accepts any key there, and our
readers take a default for a key that is absent, so without this check a typo runs silently with the default
(``custom.entropy.top_kk=20`` sampling over the full vocabulary, ``custom.over_sample.carry_ovr=true`` dropping
what it meant to carry). :func:`check_custom_keys` walks the tree below, declared from each reader's own key list,
and fails on the first key that is not there, naming it and the closest valid key (``config/keys.py``). A section
of ``custom`` that is not ours is left alone (another plugin's) unless its name is a near-miss of one of ours.

It runs wherever the run's features are read (``features.RunFeatures.from_config``: the trainer's process at
start-up on both stacks, before any server or worker exists). The values are checked by each section's reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from treetune_verl.config.keys import check_known_keys, closest, plain
from treetune_verl.control.settings import KEYS as CONTROL_KEYS
from treetune_verl.forecast.early_warning import WarningSettings
from treetune_verl.forecast.settings import KEYS as FORECAST_KEYS
from treetune_verl.ppo.entropy_advantage import SHAPING_KEYS, STEERING_KEYS
from treetune_verl.rollout.rollout_config import (
    CONFIG_PATH,
    ENTROPY_KEYS,
    ENTROPY_SECTION,
    MANAGED_KEYS,
    MANAGED_SECTION,
    read_key,
)

CUSTOM_PATH = f"{CONFIG_PATH}.custom"
FORECAST_SECTION = "entropy_forecast"
CONTROL_SECTION = "entropy_control"
OVER_SAMPLE_SECTION = "over_sample"
# read in trainer/features.py, whose full paths are built from this list, in this order
OVER_SAMPLE_KEYS = ("abort_failed_rows", "carry_over", "max_staleness")
# A key maps to None (a value, checked by its reader) or to the tree of a nested section. ``entropy_forecast.probe``
# is a partial probe config, checked key by key by the probe's own schema (``probe/config``, struct mode).
Tree = dict[str, "Tree | None"]
SECTIONS: Tree = {
    ENTROPY_SECTION: {
        **dict.fromkeys(ENTROPY_KEYS),
        **dict.fromkeys(STEERING_KEYS),
        "advantage_shaping": dict.fromkeys(SHAPING_KEYS),
    },
    OVER_SAMPLE_SECTION: dict.fromkeys(OVER_SAMPLE_KEYS),
    MANAGED_SECTION: dict.fromkeys(MANAGED_KEYS),
    FORECAST_SECTION: {
        **dict.fromkeys(FORECAST_KEYS),
        "early_warning": dict.fromkeys(field.name for field in fields(WarningSettings)),
    },
    CONTROL_SECTION: dict.fromkeys(CONTROL_KEYS),
}
# How like one of ours a section name of ``custom`` must be to count as its misspelling (difflib's ratio): higher
# than for keys inside our sections, since ``custom`` is shared with other plugins (``entropy_forcast`` 0.97).
SECTION_NAME_MATCH = 0.8


def check_custom_keys(rollout_config: Any) -> None:
    """Refuse an unknown key in any of our ``rollout.custom`` sections (``None`` or no ``custom``: nothing to check).

    Args:
        rollout_config: ``actor_rollout_ref.rollout`` as verl hands it out (a DictConfig, a dict, or its
            ``RolloutConfig`` dataclass).

    Raises:
        ValueError: naming the full key (``actor_rollout_ref.rollout.custom.entropy.top_kk``) and the closest valid
            one; or a section name that is a near-miss of ours (``custom.entropy_forcast``).
    """
    custom = plain(read_key(rollout_config, "custom"))
    if not custom:
        return
    if not isinstance(custom, Mapping):
        raise ValueError(f"{CUSTOM_PATH} must be a mapping, got {custom!r}")
    for name, section in custom.items():
        if name not in SECTIONS:
            guess = closest(name, SECTIONS, cutoff=SECTION_NAME_MATCH)
            if guess is not None:
                raise ValueError(
                    f"{CUSTOM_PATH}.{name}: not a treetune section; did you mean {guess!r}? (ours: {sorted(SECTIONS)})"
                )
            continue
        _check_tree(section, SECTIONS[name], f"{CUSTOM_PATH}.{name}")


def _check_tree(section: Any, tree: Tree, where: str) -> None:
    """Check ``section``'s keys against ``tree``, then each nested section's; a value that is not a mapping where a
    section belongs is left to its reader, which names the type it wants."""
    if not isinstance(section, Mapping):
        return
    check_known_keys(section, tree, where)
    for key, subtree in tree.items():
        if subtree is not None and key in section:
            _check_tree(section[key], subtree, f"{where}.{key}")
