# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""treetune-verl: per-token sampling entropy from sglang into verl rollouts, and an entropy-change probe."""

from treetune_verl import log_level

__version__ = "0.1.0"

log_level.apply()  # TREETUNE_LOG_LEVEL, in every process that imports the package
