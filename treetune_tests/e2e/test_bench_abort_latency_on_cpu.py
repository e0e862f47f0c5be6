# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``bench_abort_latency.py`` reads what the package logs: the server's line for a request of an aborted session,
written by the server's own methods, parsed by the bench; the decode step's line and a step's figures by hand."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from treetune_tests.e2e.bench_abort_latency import (
    decode_step_line,
    log_figures,
    percentile,
    served_requests,
    step_figures,
)


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


def test_the_bench_reads_the_servers_served_line(caplog):
    from treetune_verl.rollout.server import EntropySGLangHttpServer
    from treetune_verl.rollout.session import eval_request_id

    with caplog.at_level(logging.DEBUG, logger="treetune_verl.rollout.server"):
        EntropySGLangHttpServer._log_served("tts-ab:0f", "length", 64, time.monotonic() - 2.0)
        EntropySGLangHttpServer._log_served("x", "stop", 3, time.monotonic() - 0.5)
        EntropySGLangHttpServer._log_served("tts-ab:1e", "abort", 7, time.monotonic())  # cut: not a decode-step sample
        EntropySGLangHttpServer._log_served(eval_request_id("tts-ab:"), "length", 64, time.monotonic())  # E: queued
    served = served_requests(caplog.text)
    assert [n for n, _ in served] == [64, 3]
    assert 2.0 <= served[0][1] < 10 and 0.5 <= served[1][1] < 10


def test_the_decode_step_is_the_slope_of_the_requests_seconds_and_the_fixed_part_its_intercept():
    requests = [(n, 0.4 + 0.12 * n) for n in (64, 64, 30, 2, 1, 17)]
    assert decode_step_line(requests) == pytest.approx((0.12, 0.4))
    wait = {"step": 4, "rollout/abort_wait_s": 0.3, "timing_s/gen": 9.0, "response_length/max": 2}
    wait |= {"timing_s/treetune/over_sampling": 0.31, "cpu_s/treetune/over_sampling": 0.002}
    # the per-step ratio the bench used before would have read (9.0 - 0.3) / 2 = 4.35 s per decode step here
    assert step_figures(wait, 0.12) == pytest.approx(
        {"step": 4, "abort_wait_s": 0.3, "decode_steps": 2.5, "over_sampling_s": 0.31, "over_sampling_cpu_s": 0.002}
    )


def test_requests_of_one_length_give_no_decode_step():
    with pytest.raises(ValueError, match="span 2-5 tokens"):
        decode_step_line([(2, 0.5), (5, 0.9), (3, 0.6)])
    with pytest.raises(ValueError, match="span no tokens"):
        decode_step_line([])


def test_percentiles_by_hand():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and percentile([5.0], 0.95) == 5.0
