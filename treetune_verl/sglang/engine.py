# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Turn entropy extraction on for sglang Engines started from this process, and the arguments to start one on CPU.

The user's entry point to the sglang side (the verl side calls it too, from its server's ``launch_server``):

    from treetune_verl.sglang.engine import install
    install(top_k=0, mode="raw")          # before sglang.Engine(...)
    engine = sglang.Engine(model_path=..., ...)
    out = engine.generate(prompt, {"max_new_tokens": 32}, return_logprob=True)
    out["meta_info"]["output_token_entropy"]   # list[float], nats, one per generated token

``install`` exports the configuration for the spawned scheduler processes, injects
``custom_run_scheduler_process`` as ``sglang.srt.entrypoints.engine.run_scheduler_process`` (looked up by
``_launch_subprocesses`` when it runs), wraps ``_launch_subprocesses`` to refuse unsupported server arguments
before anything is spawned, and patches the TokenizerManager. Idempotent; a later call changes the configuration
for Engines started after it.
"""

from __future__ import annotations

import functools

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import SGLANG, Wrap, check_sglang_version
from treetune_verl.sglang.scheduler_process import custom_run_scheduler_process
from treetune_verl.sglang.server_args import check_server_args
from treetune_verl.sglang.tokenizer_patches import apply_tokenizer_patches

_LAUNCH_PARAMS = ("server_args", "port_args")  # sglang 0.5.6.post2 entrypoints/engine.py _launch_subprocesses


def _wrap_launch(original):
    @functools.wraps(original)
    def _launch_subprocesses(server_args, port_args=None):
        check_server_args(server_args)
        return original(server_args, port_args)

    return _launch_subprocesses


def install(top_k: int | None = 0, mode: str = "raw") -> EntropyConfig:
    """Enable per-token entropy for Engines created afterwards in this process; returns the configuration."""
    config = EntropyConfig(top_k=top_k, mode=mode)  # validates before touching anything
    check_sglang_version()
    from sglang.srt.entrypoints import engine as engine_mod

    SGLANG.wrap(Wrap(engine_mod, "_launch_subprocesses", _wrap_launch, _LAUNCH_PARAMS, "engine._launch_subprocesses"))
    config.export()
    engine_mod.run_scheduler_process = custom_run_scheduler_process
    apply_tokenizer_patches()
    return config


def is_installed() -> bool:
    from sglang.srt.entrypoints import engine as engine_mod

    return engine_mod.run_scheduler_process is custom_run_scheduler_process


# Arguments under which a real sglang 0.5.6.post2 Engine runs on a CPU-only machine (torch-native attention,
# pytorch sampling, no CUDA graphs, no grammar backend: xgrammar is not installed by the CPU setup).
CPU_ENGINE_KWARGS: dict[str, object] = dict(
    device="cpu",
    attention_backend="torch_native",
    sampling_backend="pytorch",
    disable_cuda_graph=True,
    grammar_backend="none",
    dtype="float32",
    # On CPU sglang sizes the KV pool from *currently available* RAM: rest = available_after_weights
    # - available_before * (1 - fraction). A small fraction fails as soon as other processes take memory; the
    # pool itself is capped by max_total_tokens, so a generous fraction costs nothing.
    mem_fraction_static=0.3,
    max_total_tokens=4096,
    max_running_requests=8,
    chunked_prefill_size=64,
    skip_server_warmup=True,
    # An idle scheduler otherwise busy-polls a core; on a 2-core machine that slows whatever else runs (another
    # Engine, the HF recomputation in tests). It wakes at once on a request (zmq poll).
    sleep_on_idle=True,
)


def engine_kwargs(model_path: str, device: str = "auto", **overrides: object) -> dict[str, object]:
    """Engine arguments for ``device`` ("auto": CUDA when available, else the CPU set above)."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    kwargs: dict[str, object] = {"model_path": str(model_path)}
    if device == "cpu":
        kwargs.update(CPU_ENGINE_KWARGS)
    kwargs.update(overrides)
    return kwargs
