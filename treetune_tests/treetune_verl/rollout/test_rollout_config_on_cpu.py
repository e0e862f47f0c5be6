# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``check_rollout_config`` / ``entropy_config`` on the real Hydra-composed ``ppo_trainer`` rollout section (verl 0.7.1
or 0.9.1)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from treetune_tests.treetune_verl.verl_config import compose_ppo_trainer
from treetune_verl.rollout.rollout_config import check_rollout_config
from treetune_verl.sglang.patching import UnsupportedSGLangError


@pytest.fixture(scope="module")
def config(tiny_model_dir):
    return compose_ppo_trainer(tiny_model_dir, 64, 128)


def test_config_refusals(config):
    rollout = OmegaConf.to_container(config.actor_rollout_ref.rollout, resolve=True)
    assert check_rollout_config(rollout).top_k is None
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        check_rollout_config({**rollout, "calculate_log_probs": False})
    with pytest.raises(ValueError, match="custom.entropy"):
        check_rollout_config({**rollout, "custom": {"entropy": {"top_k": 0, "mode": "hot"}}})
    with pytest.raises(UnsupportedSGLangError, match="dp_size"):
        check_rollout_config({**rollout, "data_parallel_size": 2})
    mtp = {**rollout["mtp"], "enable": True, "enable_rollout": True, "speculative_algorithm": "EAGLE"}
    with pytest.raises(UnsupportedSGLangError, match="speculative"):
        check_rollout_config({**rollout, "mtp": mtp})
    with pytest.raises(UnsupportedSGLangError, match="speculative"):
        check_rollout_config({**rollout, "engine_kwargs": {"sglang": {"speculative_algorithm": "NGRAM"}}})
