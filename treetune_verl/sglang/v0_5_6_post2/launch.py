# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``install`` on sglang 0.5.6.post2: our scheduler entry point injected, launches checked, TokenizerManager patched.

``custom_run_scheduler_process`` becomes ``sglang.srt.entrypoints.engine.run_scheduler_process`` (looked up by
``_launch_subprocesses`` when it runs: a ``Replace``, as the spawned process runs our entry point whole), and
``_launch_subprocesses`` refuses unsupported server arguments before anything is spawned.
"""

from __future__ import annotations

import functools

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import SGLANG, Replace, Wrap, is_replaced, takes
from treetune_verl.sglang.server_args import check_server_args
from treetune_verl.sglang.tokenizer_patches import apply_tokenizer_patches
from treetune_verl.sglang.v0_5_6_post2.scheduler_process import custom_run_scheduler_process

_LAUNCH_PARAMS = ("server_args", "port_args")  # sglang 0.5.6.post2 entrypoints/engine.py _launch_subprocesses
# sglang 0.5.6.post2 managers/scheduler.py run_scheduler_process, which ours takes the place of
_SCHEDULER_PROCESS_PARAMS = (
    "server_args",
    "port_args",
    "gpu_id",
    "tp_rank",
    "moe_ep_rank",
    "pp_rank",
    "dp_rank",
    "pipe_writer",
)


def _wrap_launch(original):
    @functools.wraps(original)
    def _launch_subprocesses(server_args, port_args=None):
        check_server_args(server_args)
        return original(server_args, port_args)

    return _launch_subprocesses


def install(config: EntropyConfig) -> None:
    from sglang.srt.entrypoints import engine as engine_mod

    SGLANG.wrap(Wrap(engine_mod, "_launch_subprocesses", _wrap_launch, _LAUNCH_PARAMS, "engine._launch_subprocesses"))
    config.export()
    SGLANG.replace(
        Replace(
            engine_mod,
            "run_scheduler_process",
            lambda _: custom_run_scheduler_process,
            takes(*_SCHEDULER_PROCESS_PARAMS),
            why="the spawned scheduler's entry point: ours applies the patches in that process, then runs sglang's",
            where="engine.run_scheduler_process",
        )
    )
    apply_tokenizer_patches()


def is_installed() -> bool:
    from sglang.srt.entrypoints import engine as engine_mod

    return is_replaced(engine_mod, "run_scheduler_process")
