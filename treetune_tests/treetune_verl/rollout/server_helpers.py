# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The server tests' one way to build ``EntropySGLangHttpServer`` in this process, and to stop what it launched."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path
from typing import Any

from omegaconf import open_dict

from treetune_tests.treetune_verl.verl_config import compose_ppo_trainer
from treetune_verl.sglang.engine import cpu_engine_kwargs


def server_config(
    model_path: Path | str,
    prompt_length: int,
    response_length: int,
    engine: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    **rollout: Any,
):
    """The Hydra-composed config with the README block, TP 1, n 1 and ``overrides``, the CPU engine settings (plus
    ``engine``) through ``rollout.engine_kwargs.sglang`` (verl spreads them last), and ``rollout`` keys set on the
    rollout section."""
    config = compose_ppo_trainer(
        model_path,
        prompt_length,
        response_length,
        extra=[
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.n=1",
            *(overrides or []),
        ],
    )
    with open_dict(config):
        config.actor_rollout_ref.rollout.engine_kwargs.sglang = {
            **cpu_engine_kwargs(),
            "enable_memory_saver": False,  # torch_memory_saver is CUDA-only
            "random_seed": 0,
            **(engine or {}),
        }
        for key, value in rollout.items():
            config.actor_rollout_ref.rollout[key] = value
    return config


def make_server(config):
    """verl's own ``__init__`` of our server, standalone, on this process (no Ray)."""
    from verl.workers.rollout.replica import RolloutMode

    from treetune_verl.rollout.server import EntropySGLangHttpServer

    return EntropySGLangHttpServer(
        config=config.actor_rollout_ref.rollout,
        model_config=config.actor_rollout_ref.model,
        rollout_mode=RolloutMode.STANDALONE,
        workers=[],
        replica_rank=0,
        node_rank=0,
        nnodes=1,
        cuda_visible_devices="",
        base_gpu_id=0,
    )


def _stop_subprocess_watchdogs() -> None:
    """Stop sglang's subprocess watchdogs in this process (sglang >= 0.5.12; none before).

    ``Engine._launch_subprocesses`` starts a ``SubprocessWatchdog`` thread that sends this process SIGQUIT when one
    of its subprocesses exits with an error; verl's ``launch_server`` discards the object (``async_sglang_server.py``,
    ``*_ = Engine._launch_subprocesses(...)``), so killing the processes below would kill the test run a second later.
    In a training run the server is a Ray actor whose whole process goes away instead.
    """
    try:
        from sglang.srt.utils.watchdog import SubprocessWatchdog
    except ImportError:
        return
    for obj in gc.get_objects():
        if isinstance(obj, SubprocessWatchdog):
            obj.stop()


async def stop_server(server) -> None:
    """Stop verl's uvicorn task and every process the launch started (sglang's scheduler and detokenizer)."""
    from sglang.srt.utils import kill_process_tree

    if getattr(server, "_server_task", None) is not None:
        server._server_task.cancel()
        await asyncio.gather(server._server_task, return_exceptions=True)
    await _cancel_tokenizer_manager_tasks(server)
    _stop_subprocess_watchdogs()
    kill_process_tree(os.getpid(), include_parent=False)
    _close_tokenizer_manager_sockets(server)


async def _cancel_tokenizer_manager_tasks(server) -> None:
    """Cancel and await the in-process TokenizerManager's loops (``asyncio_tasks``: ``handle_loop`` and its watchdogs,
    sglang 0.5.6.post2 and 0.5.12) before its sockets are closed.

    Each runs in sglang's ``print_exception_wrapper``, which answers any exception with ``kill_process_tree(os.getpid(),
    include_parent=True)``: left running, ``handle_loop``'s next ``recv_pyobj`` on the closed socket raised
    ``ZMQError: Socket operation on non-socket`` and SIGKILLed the test run (a fresh-clone CI's current suite, and 1
    of 16 runs of ``test_server_abort_on_cpu.py`` here beside a CPU load). Cancelling is not an ``Exception``.
    """
    tokenizer_manager = getattr(server, "tokenizer_manager", None)
    tasks = list(getattr(tokenizer_manager, "asyncio_tasks", ()))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _close_tokenizer_manager_sockets(server) -> None:
    """Close the in-process TokenizerManager's zmq context now, dropping what it still queues for the killed scheduler.

    sglang's ``TokenizerManager.__init__`` creates the context as a local (``tokenizer_manager.py:271``) whose sockets
    keep the default linger (infinite). Left to the garbage collector, ``zmq.Context.__del__`` -> ``term()`` then waits
    forever for a message to a scheduler that no longer exists, wherever the collection happens to run: a fresh-clone
    CI run hung that way in a later test's YAML parsing.
    """
    tokenizer_manager = getattr(server, "tokenizer_manager", None)
    socket = getattr(tokenizer_manager, "send_to_scheduler", None)
    if socket is not None and not socket.context.closed:
        socket.context.destroy(linger=0)
