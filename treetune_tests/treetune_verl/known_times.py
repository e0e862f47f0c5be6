# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Stand-ins whose working time is known, and the tolerance the cost metrics are held to (issue 49).

A stand-in works by burning CPU until its thread's CPU clock has advanced by the stated seconds (a loaded machine
stretches its wall time, never its CPU time); the cost metrics must give the true times within 10 %, with an absolute
floor of 20 ms for a loaded 2-core machine's scheduling jitter.
"""

from __future__ import annotations

import time

TOLERANCE = 0.1  # relative
FLOOR_S = 0.02  # absolute


def burn_cpu(seconds: float) -> None:
    """Work: this thread's CPU clock advances by ``seconds``."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def close(value: float, truth: float) -> bool:
    """``value`` within 10 % of ``truth`` (20 ms floor)."""
    return abs(value - truth) <= max(TOLERANCE * truth, FLOOR_S)
