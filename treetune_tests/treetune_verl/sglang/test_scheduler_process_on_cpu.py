# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``scheduler_process``: the injected spawn entry point patches the scheduler process, then runs sglang's own.

In this process (the spawned child is what the ``engine``-marked tests exercise): ``custom_run_scheduler_process``
reads the configuration the parent exported, refuses unsupported server arguments, applies every scheduler patch
and hands its exact arguments to sglang 0.5.6.post2's real ``run_scheduler_process`` (replaced here by a recorder,
which would otherwise start an event loop). Reference: the arguments passed and the patched sglang classes.
"""

from __future__ import annotations

import copy

import pytest
from sglang.srt.layers import sampler as sampler_mod
from sglang.srt.managers import scheduler as scheduler_mod
from sglang.srt.managers.scheduler import Scheduler

from treetune_tests.treetune_verl.sglang.sglang_objects import SCHEDULER_TARGETS, current
from treetune_verl.sglang.config import ENV_MODE, ENV_TOP_K, EntropyConfig
from treetune_verl.sglang.patching import UnsupportedSGLangError, is_patched
from treetune_verl.sglang.v0_5_6_post2.scheduler_process import custom_run_scheduler_process


@pytest.fixture
def upstream_calls(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(scheduler_mod, "run_scheduler_process", lambda *args: calls.append(args) or "ran")
    return calls


def test_patches_from_the_exported_config_then_runs_sglang(pristine, server_args, upstream_calls, monkeypatch):
    EntropyConfig(top_k=5, mode="tempered").export()  # what install() does in the parent
    assert not is_patched(Scheduler, "process_batch_result_decode")
    args = (server_args, "port_args", 0, 1, 2, 3, None, "pipe_writer")
    assert custom_run_scheduler_process(*args) == "ran"
    assert upstream_calls == [args]
    assert all(is_patched(owner, name) for owner, name in SCHEDULER_TARGETS if owner is Scheduler)
    assert sampler_mod.Sampler.__name__ == "EntropySampler"
    assert sampler_mod.Sampler.entropy_config == EntropyConfig(top_k=5, mode="tempered")


def test_defaults_without_an_exported_config(pristine, server_args, upstream_calls):
    custom_run_scheduler_process(server_args, None, 0, 0, 0, 0, None, None)
    assert sampler_mod.Sampler.entropy_config == EntropyConfig()
    assert len(upstream_calls) == 1


def test_refuses_unsupported_server_args_before_patching_or_running(pristine, server_args, upstream_calls):
    bad = copy.copy(server_args)
    bad.dp_size = 2
    before = current(SCHEDULER_TARGETS)
    with pytest.raises(UnsupportedSGLangError, match="dp_size > 1"):
        custom_run_scheduler_process(bad, None, 0, 0, 0, 0, None, None)
    assert upstream_calls == []
    assert all(a is b for a, b in zip(before, current(SCHEDULER_TARGETS), strict=True))


def test_bad_exported_config_is_refused_in_the_child(pristine, server_args, upstream_calls, monkeypatch):
    monkeypatch.setenv(ENV_TOP_K, "-2")
    monkeypatch.setenv(ENV_MODE, "raw")
    with pytest.raises(ValueError, match="top_k"):
        custom_run_scheduler_process(server_args, None, 0, 0, 0, 0, None, None)
    assert upstream_calls == []
