# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``TREETUNE_LOG_LEVEL``: our loggers' level in every process, with a handler of their own.

verl's and Ray's processes leave the root logger without a handler at ``WARNING``, so our ``INFO`` lines (e.g. the
abort's latency, ``rollout/server.py`` and ``verl/v0_9_1/over_sample_sampler.py``) are dropped there. Set
``TREETUNE_LOG_LEVEL=INFO`` before the run (Ray's workers on one machine inherit the driver's environment) and the
``treetune_verl`` loggers print at that level to stderr, which Ray forwards to the driver. Unset: nothing changes.
A shared leaf: imports nothing of the package.
"""

from __future__ import annotations

import logging
import os

ENV_KEY = "TREETUNE_LOG_LEVEL"
_HANDLER_NAME = "treetune_verl"


def apply(environ: dict[str, str] | None = None) -> None:
    """Set the ``treetune_verl`` logger's level from ``TREETUNE_LOG_LEVEL`` (idempotent: one handler).

    Raises:
        ValueError: a level Python's ``logging`` does not know, naming the variable.
    """
    value = (os.environ if environ is None else environ).get(ENV_KEY)
    if not value:
        return
    level = logging.getLevelName(value.upper())
    if not isinstance(level, int):
        raise ValueError(f"{ENV_KEY}={value!r} is not a logging level (DEBUG, INFO, WARNING, ERROR)")
    logger = logging.getLogger("treetune_verl")
    logger.setLevel(level)
    if not any(handler.get_name() == _HANDLER_NAME for handler in logger.handlers):
        handler = logging.StreamHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False  # the handler above prints it; a configured root would print it twice
