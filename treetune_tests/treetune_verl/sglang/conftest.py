# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the in-process sglang tests: server arguments, patch restore, and real sglang managers.

sglang is imported inside the fixtures (through ``sglang_objects``), so the plain-torch tests of this folder
(``test_entropy_on_cpu``, ``test_config_on_cpu``, ``test_store_on_cpu``) run without importing it.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import ServerArgs


@pytest.fixture(scope="session")
def base_server_args(tiny_model_dir) -> ServerArgs:
    """Real ``ServerArgs`` of a CPU Engine on the tiny model (``engine.CPU_ENGINE_KWARGS``); built once per session
    because construction reads the model config. Tests use the per-test copy :func:`server_args`."""
    from sglang.srt.server_args import ServerArgs

    from treetune_verl.sglang.engine import engine_kwargs

    return ServerArgs(**engine_kwargs(str(tiny_model_dir), "cpu"))


@pytest.fixture
def server_args(base_server_args, monkeypatch) -> ServerArgs:
    """A fresh copy installed as sglang's global server args for this test (restored afterwards)."""
    from sglang.srt import server_args as server_args_mod

    monkeypatch.setattr(server_args_mod, "_global_server_args", server_args_mod._global_server_args)  # restore
    args = copy.copy(base_server_args)
    server_args_mod.set_global_server_args_for_scheduler(args)
    return args


@pytest.fixture
def pristine(monkeypatch, server_args) -> None:
    """Upstream sglang (no patch applied) for this test; whatever the session had is restored afterwards."""
    from sglang.srt.entrypoints import engine as engine_mod
    from sglang.srt.managers import scheduler as scheduler_mod

    from treetune_tests.treetune_verl.sglang.sglang_objects import ALL_TARGETS, unpatch
    from treetune_verl.sglang.config import ENV_ENABLED, ENV_MODE, ENV_TOP_K
    from treetune_verl.sglang.patching import ENV_ALLOW_UNSUPPORTED

    unpatch(monkeypatch, ALL_TARGETS)
    monkeypatch.setattr(engine_mod, "run_scheduler_process", scheduler_mod.run_scheduler_process)
    for var in (ENV_ENABLED, ENV_TOP_K, ENV_MODE, ENV_ALLOW_UNSUPPORTED):
        monkeypatch.setenv(var, "")  # records the prior value (or its absence) for teardown
        monkeypatch.delenv(var)


@pytest.fixture
def patched(pristine) -> None:
    """Scheduler-process and TokenizerManager patches applied (full vocabulary, raw); undone after the test."""
    from treetune_verl.sglang.config import EntropyConfig
    from treetune_verl.sglang.tokenizer_patches import apply_tokenizer_patches
    from treetune_verl.sglang.v0_5_6_post2.scheduler_patches import apply_scheduler_patches

    apply_scheduler_patches(EntropyConfig())
    apply_tokenizer_patches()


def _module_state(module: types.ModuleType) -> list[str]:
    """Names of ``module``'s private globals that hold state (process groups, ranks), not code."""
    return [
        name
        for name, value in vars(module).items()
        if name.startswith("_")
        and not name.startswith("__")
        and not callable(value)
        and not isinstance(value, types.ModuleType)
    ]


@pytest.fixture
def real_scheduler(server_args, monkeypatch) -> Iterator[Callable[..., Scheduler]]:
    """Builds one fully real ``Scheduler`` for this test (``sglang_objects.build_scheduler``); call it after the
    patches are applied, as ``custom_run_scheduler_process`` does. Afterwards its zmq sockets are closed, its gloo
    process group is destroyed and sglang's process-group globals are put back, so that later tests of the session
    do not run inside an initialised ``torch.distributed``."""
    import torch.distributed
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers import dp_attention

    from treetune_tests.treetune_verl.sglang.sglang_objects import build_scheduler, close_zmq

    assert not torch.distributed.is_initialized(), "another test left torch.distributed initialised"
    for module in (parallel_state, dp_attention):
        for name in _module_state(module):
            monkeypatch.setattr(module, name, getattr(module, name))
    built: list[tuple[Any, list[Any]]] = []

    def build(*, overlap: bool = False) -> Scheduler:
        assert not built, "one real Scheduler per test: sglang's process groups are process-wide"
        built.append(build_scheduler(server_args, overlap=overlap))
        return built[0][0]

    yield build
    for scheduler, sockets in built:
        scheduler.cur_batch = None  # keeps its (never stopped) watchdog thread quiet
        close_zmq(*sockets)
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
    assert not torch.distributed.is_initialized()


@pytest.fixture
def tokenizer_manager(server_args) -> Iterator[TokenizerManager]:
    """A real ``TokenizerManager`` on the tiny model; its zmq sockets are closed afterwards."""
    from treetune_tests.treetune_verl.sglang.sglang_objects import build_tokenizer_manager, close_zmq

    manager = build_tokenizer_manager(server_args)
    yield manager
    close_zmq(manager.recv_from_detokenizer, manager.send_to_scheduler)


@pytest.fixture
def detokenizer_manager(server_args) -> Iterator[DetokenizerManager]:
    """A real ``DetokenizerManager`` on the tiny model; its zmq sockets are closed afterwards."""
    from treetune_tests.treetune_verl.sglang.sglang_objects import build_detokenizer_manager, close_zmq

    manager = build_detokenizer_manager(server_args)
    yield manager
    close_zmq(manager.recv_from_scheduler, manager.send_to_tokenizer)


@pytest.fixture(params=[False, True], ids=["sync", "overlap"])
def scenario(request, patched, real_scheduler):
    """``scheduler_scenario.run_scenario`` on a real patched Scheduler, without and with overlap scheduling."""
    from treetune_tests.treetune_verl.sglang.scheduler_scenario import run_scenario

    return run_scenario(real_scheduler(overlap=request.param))
