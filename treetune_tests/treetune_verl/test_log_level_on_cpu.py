# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``TREETUNE_LOG_LEVEL``: our INFO lines printed where the root logger drops them (verl's and Ray's processes)."""

from __future__ import annotations

import logging

import pytest

from treetune_verl import log_level


@pytest.fixture
def package_logger():
    logger = logging.getLogger("treetune_verl")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    yield logger
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate = saved[2]


def test_unset_changes_nothing(package_logger):
    before = (package_logger.level, list(package_logger.handlers))
    log_level.apply({})
    assert (package_logger.level, list(package_logger.handlers)) == before


def test_info_prints_our_lines_once_through_one_handler(package_logger, capsys):
    log_level.apply({"TREETUNE_LOG_LEVEL": "info"})
    log_level.apply({"TREETUNE_LOG_LEVEL": "INFO"})  # idempotent
    assert package_logger.level == logging.INFO
    assert [h.get_name() for h in package_logger.handlers].count("treetune_verl") == 1
    logging.getLogger("treetune_verl.rollout.server").info("abort latency: a line")
    assert capsys.readouterr().err.count("abort latency: a line") == 1


def test_a_level_that_does_not_exist_is_refused_by_name():
    with pytest.raises(ValueError, match="TREETUNE_LOG_LEVEL='loud' is not a logging level"):
        log_level.apply({"TREETUNE_LOG_LEVEL": "loud"})
