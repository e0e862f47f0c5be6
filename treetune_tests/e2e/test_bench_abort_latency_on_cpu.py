# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``bench_abort_latency.py`` reads what the package logs: the server's line for a request of an aborted session,
written by the server's own method, parsed by the bench; a step's figures by hand."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from treetune_tests.e2e.bench_abort_latency import log_figures, percentile, step_figures


def test_the_bench_parses_the_servers_own_line(caplog):
    from treetune_verl.rollout.server import EntropySGLangHttpServer

    server = SimpleNamespace(_aborted_sessions={"tts-ab:": time.monotonic() - 0.25})
    with caplog.at_level(logging.INFO, logger="treetune_verl.rollout.server"):
        EntropySGLangHttpServer._log_cut(server, "tts-ab:0f", "abort", 7)
        EntropySGLangHttpServer._log_cut(server, "tts-ab:1e", "stop", 12)
        EntropySGLangHttpServer._log_cut(server, "tts-cd:2d", "abort", 3)  # not an aborted session: no line
    figures = log_figures(caplog.text)
    assert figures["requests"] == 2 and figures["requests_not_cut"] == 1
    assert 0.25 <= figures["request_return_s_p50"] < 5


def test_a_steps_latency_in_decode_steps_by_hand():
    metrics = {"step": 3, "rollout/abort_wait_s": 0.3, "timing_s/gen": 10.3, "response_length/max": 100}
    assert step_figures(metrics) == pytest.approx(
        {"step": 3, "abort_wait_s": 0.3, "decode_step_s": 0.1, "decode_steps": 3.0}
    )
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and percentile([5.0], 0.95) == 5.0
