# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``config``: ``EntropyConfig`` validates top-k and mode, and crosses the spawn boundary through the environment.

Plain Python, no sglang. Reference: the documented encoding (``TREETUNE_ENTROPY_TOP_K`` 0 = full vocabulary,
``TREETUNE_ENTROPY_MODE`` raw | tempered, ``TREETUNE_ENTROPY=1`` the switch) and the values written by hand below.
"""

import os

import pytest

from treetune_verl.sglang.config import (
    ENTROPY_MODES,
    ENV_ENABLED,
    ENV_MODE,
    ENV_TOP_K,
    EntropyConfig,
    enabled_in_env,
    validate_top_k,
)


class TestEntropyConfig:
    def test_env_round_trip(self, monkeypatch):
        monkeypatch.setenv(ENV_TOP_K, "20")
        monkeypatch.setenv(ENV_MODE, "tempered")
        config = EntropyConfig.from_env()
        assert config == EntropyConfig(top_k=20, mode="tempered")
        assert config.to_env() == {ENV_ENABLED: "1", ENV_TOP_K: "20", ENV_MODE: "tempered"}

    def test_defaults_are_full_vocab_raw(self, monkeypatch):
        monkeypatch.delenv(ENV_TOP_K, raising=False)
        monkeypatch.delenv(ENV_MODE, raising=False)
        assert EntropyConfig.from_env() == EntropyConfig(top_k=None, mode="raw")

    @pytest.mark.parametrize(("top_k", "mode"), [("-3", "raw"), ("abc", "raw"), ("4", "sharpened")])
    def test_bad_env_is_a_value_error(self, monkeypatch, top_k, mode):
        monkeypatch.setenv(ENV_TOP_K, top_k)
        monkeypatch.setenv(ENV_MODE, mode)
        with pytest.raises(ValueError, match="TREETUNE_ENTROPY|top_k|mode"):
            EntropyConfig.from_env()

    def test_export_puts_the_config_where_a_spawned_child_reads_it(self, monkeypatch):
        monkeypatch.delenv(ENV_TOP_K, raising=False)  # restored afterwards, like the two below
        monkeypatch.delenv(ENV_MODE, raising=False)
        monkeypatch.delenv(ENV_ENABLED, raising=False)
        assert not enabled_in_env()
        EntropyConfig(top_k=7, mode="tempered").export()
        assert (os.environ[ENV_TOP_K], os.environ[ENV_MODE]) == ("7", "tempered")
        assert enabled_in_env()  # the switch the sglang >= 0.5.12 plugin reads in the scheduler process
        EntropyConfig().export()
        assert (os.environ[ENV_TOP_K], os.environ[ENV_MODE]) == ("0", "raw")
        assert EntropyConfig.from_env() == EntropyConfig()

    @pytest.mark.parametrize(("top_k", "mode"), [(" ", " "), ("", "")])
    def test_blank_env_is_the_default(self, monkeypatch, top_k, mode):
        monkeypatch.setenv(ENV_TOP_K, top_k)
        monkeypatch.setenv(ENV_MODE, mode)
        assert EntropyConfig.from_env() == EntropyConfig()


class TestValidation:
    @pytest.mark.parametrize(("top_k", "expected"), [(None, None), (0, None), (1, 1), (20, 20)])
    def test_top_k_none_or_zero_is_full_vocabulary(self, top_k, expected):
        assert validate_top_k(top_k) == expected
        assert EntropyConfig(top_k=top_k).top_k == expected

    @pytest.mark.parametrize("bad", [-1, 2.5, "3", True])
    def test_bad_top_k_is_a_value_error(self, bad):
        with pytest.raises(ValueError, match="top_k"):
            validate_top_k(bad)
        with pytest.raises(ValueError, match="top_k"):
            EntropyConfig(top_k=bad)

    def test_modes(self):
        assert ENTROPY_MODES == ("raw", "tempered", "support")
        assert EntropyConfig().mode == "raw"
        with pytest.raises(ValueError, match="mode"):
            EntropyConfig(mode="sharpened")  # type: ignore[arg-type]

    def test_frozen(self):
        with pytest.raises(AttributeError):
            EntropyConfig().top_k = 3  # type: ignore[misc]
