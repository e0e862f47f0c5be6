# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Wall time spent inside treetune's own code, per feature, so that every step can say what each feature cost.

Each process keeps one :data:`SECONDS` (``{feature: seconds}``); code of a feature runs inside
``SECONDS.timed(feature)``. The agent-loop workers send theirs to the manager with the rows of each batch
(``batch_keys.TIMING_KEY``), the manager adds them to the trainer process's, and the trainer's ``compute_timing_metrics``
seam logs them every step as ``timing_s/treetune/<feature>``, their sum ``timing_s/treetune/total`` and its share of
verl's ``timing_s/step`` (``treetune/share_of_step``). Run-to-run noise does not enter: these are the seconds our code
itself took, not a difference of two runs.

What is timed: synchronous work, and the awaited calls to the over-sampling counter (they delay the row that makes
them, while other rows keep generating). Not timed here: the entropy op inside sglang's sampler (its share of a
decode step is ``bench_entropy_throughput.py``'s), the server's copy of ``meta_info`` (another process), the
forecast (``timing_s/probe``). A shared leaf: imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping

METRIC_PREFIX = "timing_s/treetune/"
SHARE_METRIC = "treetune/share_of_step"
# Features, in the order the metrics list them.
ROLLOUT_ENTROPY = "rollout_entropy"  # the worker's padding and marks, the manager's metrics
OVER_SAMPLING = "over_sampling"  # the step's target, settling, aborts, empty rows; aborted rows' reward and metrics
STEERING = "steering"  # the advantages reshaped from rollout entropy
TRAINER_HOOKS = "trainer_hooks"  # the agreement with the actor, validation metrics, the step's pending metrics
FEATURES = (ROLLOUT_ENTROPY, OVER_SAMPLING, STEERING, TRAINER_HOOKS)


class FeatureSeconds:
    """Seconds per feature since the last :meth:`take`."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, feature: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add({feature: time.perf_counter() - start})

    def add(self, seconds: Mapping[str, float]) -> None:
        for feature, value in seconds.items():
            self._seconds[feature] = self._seconds.get(feature, 0.0) + float(value)

    def take(self) -> dict[str, float]:
        """The seconds so far, and start again from zero."""
        seconds, self._seconds = self._seconds, {}
        return seconds


SECONDS = FeatureSeconds()  # this process's


def step_metrics(seconds: Mapping[str, float], step_s: float | None) -> dict[str, float]:
    """``timing_s/treetune/<feature>`` for every feature (0.0 when it did not run), ``.../total`` and, given verl's
    ``step`` seconds, ``treetune/share_of_step``."""
    metrics = {METRIC_PREFIX + feature: float(seconds.get(feature, 0.0)) for feature in FEATURES}
    total = sum(metrics.values())
    metrics[METRIC_PREFIX + "total"] = total
    if step_s:
        metrics[SHARE_METRIC] = total / step_s
    return metrics
