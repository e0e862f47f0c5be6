# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""A typo in any key of our ``rollout.custom`` sections stops the run at start-up, naming the key and the closest one.

Each command line is the e2e script's own with every feature on (``E2E_PRINT_ARGS=1``, composed by Hydra from the
installed verl's real ``ppo_trainer``), plus one misspelt key, then put through the start-up check of the installed
stack (verl 0.7.1: ``check_features``, which our manager's ``trainer_setup.install`` runs; verl 0.9.1:
``check_current_stack``, which the server selection runs). Without the check each of these runs: verl's ``custom``
is an open mapping and our readers default an absent key.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from treetune_tests.treetune_verl.trainer.test_features_on_cpu import FEATURES, _command_line, _compose
from treetune_verl.trainer.features import check_current_stack, check_features

CUSTOM = "actor_rollout_ref.rollout.custom"
VERL = importlib.metadata.version("verl")


def _start_up(config):
    """The installed stack's start-up check of the run's features."""
    return check_current_stack(config, VERL) if VERL == "0.9.1" else check_features(config)


@pytest.fixture(scope="module")
def every_feature(tiny_model_dir, tmp_path_factory) -> list[str]:
    """The e2e script's command line with over-sampling, the forecast and forking tokens, plus managed sessions'
    and advantage shaping's keys (their sections present, as a user's run has them)."""
    lines = _command_line(
        ("over_sampling", "forecast", "forking_tokens"), tiny_model_dir, tmp_path_factory.mktemp("e2e")
    )
    sections = [
        f"+{CUSTOM}.managed.rows_per_session=1",
        f"+{CUSTOM}.over_sample.max_staleness=2",
        f"+{CUSTOM}.entropy_control.target_fraction=0.8",
        f"+{CUSTOM}.entropy_control.width=0.4",
    ]
    return [*lines, *FEATURES["advantage_shaping"][1], *sections]


def test_the_command_line_with_every_section_starts(every_feature):
    """The negative control: the same command line without a typo starts, every section present, as does a
    ``custom`` section of another plugin."""
    config = _compose([*every_feature, f"+{CUSTOM}.my_plugin.top_kk=1"])
    custom = set(config.actor_rollout_ref.rollout.custom)
    assert custom >= {"entropy", "over_sample", "managed", "entropy_forecast", "entropy_control"}
    assert {"over_sampling", "steering", "forecast", "control"} <= set(_start_up(config).enabled)


# (the override after `custom.`, the misspelt key's path in the message, the closest valid key)
TYPOS = [
    ("entropy.top_kk=20", "entropy.top_kk", "top_k"),
    ("entropy.pg_token_quantil=0.2", "entropy.pg_token_quantil", "pg_token_quantile"),
    ("entropy.advantage_shaping.alpah=0.4", "entropy.advantage_shaping.alpah", "alpha"),
    ("over_sample.carry_ovr=true", "over_sample.carry_ovr", "carry_over"),
    ("managed.rows_per_sesion=2", "managed.rows_per_sesion", "rows_per_session"),
    ("entropy_forecast.evry=2", "entropy_forecast.evry", "every"),
    ("entropy_forecast.early_warning.fractoin=0.3", "entropy_forecast.early_warning.fractoin", "fraction"),
    ("entropy_control.widht=0.3", "entropy_control.widht", "width"),
]


@pytest.mark.parametrize(("override", "key", "closest"), TYPOS, ids=[key for _, key, _ in TYPOS])
def test_a_typo_in_each_section_fails_naming_the_key_and_the_closest(every_feature, override, key, closest):
    config = _compose([*every_feature, f"++{CUSTOM}.{override}"])
    with pytest.raises(ValueError, match=rf"{CUSTOM}\.{key}: unknown key; did you mean '{closest}'\?"):
        _start_up(config)


def test_a_misspelt_section_name_fails_naming_ours(every_feature):
    config = _compose([*every_feature, f"+{CUSTOM}.entropy_forcast.every=2"])
    with pytest.raises(
        ValueError, match=rf"{CUSTOM}\.entropy_forcast: not a treetune section; did you mean 'entropy_forecast'"
    ):
        _start_up(config)
