# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""treetune-verl: per-token sampling entropy from sglang into verl rollouts, and an entropy-change probe."""

__version__ = "0.1.0"
