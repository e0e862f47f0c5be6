# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``engine``: ``install()`` wires entropy into sglang 0.5.6.post2 Engines started from this process.

In this process, on the real ``sglang.srt.entrypoints.engine`` module: ``install`` is idempotent, exports the
configuration that the spawned scheduler reads back, injects ``custom_run_scheduler_process`` (same parameters as
sglang's, picklable for spawn), patches the TokenizerManager, validates its arguments before touching anything, and
its ``_launch_subprocesses`` wrapper refuses unsupported server arguments before sglang configures or spawns
anything. ``engine_kwargs`` gives the CPU Engine arguments. The Engine itself runs in the ``engine``-marked tests.
"""

from __future__ import annotations

import copy
import inspect
import os
import pickle
from types import SimpleNamespace

import pytest
from sglang.srt.entrypoints import engine as engine_mod
from sglang.srt.managers import scheduler as scheduler_mod
from sglang.srt.server_args import ServerArgs

from treetune_tests.treetune_verl.sglang.sglang_objects import ENGINE_TARGETS, TOKENIZER_TARGETS, current
from treetune_verl.sglang import engine as tt_engine
from treetune_verl.sglang.config import ENV_MODE, ENV_TOP_K, EntropyConfig
from treetune_verl.sglang.patching import UnsupportedSGLangError, is_patched
from treetune_verl.sglang.v0_5_6_post2.scheduler_process import custom_run_scheduler_process


def test_install_is_idempotent_and_wires_the_scheduler_entry_point(pristine):
    config = tt_engine.install(top_k=0, mode="raw")
    assert config == EntropyConfig()
    assert engine_mod.run_scheduler_process is custom_run_scheduler_process and tt_engine.is_installed()
    first = current(ENGINE_TARGETS + TOKENIZER_TARGETS)
    assert all(is_patched(owner, name) for owner, name in TOKENIZER_TARGETS + ENGINE_TARGETS[1:])
    assert (os.environ[ENV_TOP_K], os.environ[ENV_MODE]) == ("0", "raw")

    assert tt_engine.install(top_k=7, mode="tempered") == EntropyConfig(top_k=7, mode="tempered")
    assert all(a is b for a, b in zip(first, current(ENGINE_TARGETS + TOKENIZER_TARGETS), strict=True))
    assert (os.environ[ENV_TOP_K], os.environ[ENV_MODE]) == ("7", "tempered")  # what the next Engine's scheduler reads
    assert EntropyConfig.from_env() == EntropyConfig(top_k=7, mode="tempered")

    # the injected entry point can replace sglang's: same parameters, and spawn can pickle it by reference
    upstream_params = list(inspect.signature(scheduler_mod.run_scheduler_process).parameters)
    assert list(inspect.signature(custom_run_scheduler_process).parameters) == upstream_params
    assert pickle.loads(pickle.dumps(custom_run_scheduler_process)) is custom_run_scheduler_process


def test_not_installed_on_pristine_sglang(pristine):
    assert not tt_engine.is_installed()


@pytest.mark.parametrize(("kwargs", "match"), [(dict(top_k=-1), "top_k"), (dict(mode="bad"), "mode")])
def test_install_validates_before_patching_anything(pristine, kwargs, match):
    before = current(ENGINE_TARGETS + TOKENIZER_TARGETS)
    with pytest.raises(ValueError, match=match):
        tt_engine.install(**kwargs)
    assert all(a is b for a, b in zip(before, current(ENGINE_TARGETS + TOKENIZER_TARGETS), strict=True))
    assert engine_mod.run_scheduler_process is scheduler_mod.run_scheduler_process
    assert ENV_TOP_K not in os.environ and ENV_MODE not in os.environ


def test_wrapped_launch_refuses_dp_before_spawning_anything(pristine, base_server_args, monkeypatch):
    tt_engine.install()

    def upstream_reached(*args, **kwargs):
        raise AssertionError("sglang's _launch_subprocesses started configuring/spawning")

    monkeypatch.setattr(engine_mod, "configure_logger", upstream_reached)
    monkeypatch.setattr(engine_mod, "mp", SimpleNamespace(Process=upstream_reached, Pipe=upstream_reached))
    dp_args = ServerArgs(model_path=base_server_args.model_path, device="cpu", dp_size=2)
    with pytest.raises(UnsupportedSGLangError, match=r"dp_size > 1"):
        engine_mod._launch_subprocesses(dp_args)
    with pytest.raises(AssertionError, match="configuring/spawning"):  # control: supported args do reach upstream
        engine_mod._launch_subprocesses(copy.copy(base_server_args))


def test_engine_kwargs_on_cpu_and_elsewhere(base_server_args):
    kwargs = tt_engine.engine_kwargs("/m", "cpu", random_seed=3, max_total_tokens=128)
    assert kwargs == {**tt_engine.CPU_ENGINE_KWARGS, "model_path": "/m", "random_seed": 3, "max_total_tokens": 128}
    assert tt_engine.engine_kwargs("/m", "cuda", log_level="error") == {"model_path": "/m", "log_level": "error"}
    # sglang accepts the CPU set as they are (the fixture built ServerArgs from it, on the tiny model)
    for key, value in tt_engine.CPU_ENGINE_KWARGS.items():
        assert getattr(base_server_args, key) == value, key
