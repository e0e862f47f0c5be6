# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The spawn entry point of a scheduler process with the entropy patches: the way into sglang's child process.

Spawned children inherit nothing patched in the parent, so ``install()`` injects
:func:`custom_run_scheduler_process` as ``sglang.srt.entrypoints.engine.run_scheduler_process``; it applies the
scheduler patches in the child, reading the configuration the parent exported, then runs sglang's own entry point.
"""

from __future__ import annotations

from treetune_verl.sglang.config import EntropyConfig


def custom_run_scheduler_process(
    server_args,
    port_args,
    gpu_id: int,
    tp_rank: int,
    moe_ep_rank: int,
    pp_rank: int,
    dp_rank: int | None,
    pipe_writer,
):
    """sglang's ``run_scheduler_process`` with the entropy patches applied first, in the spawned process.

    Same signature as ``sglang.srt.managers.scheduler.run_scheduler_process`` (0.5.6.post2). Must stay a top-level
    function of an importable module so that ``spawn`` can pickle it.
    """
    from treetune_verl.sglang.v0_5_6_post2.scheduler_patches import apply_scheduler_patches

    apply_scheduler_patches(EntropyConfig.from_env(), server_args)
    from sglang.srt.managers import scheduler

    return scheduler.run_scheduler_process(
        server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank, pipe_writer
    )
