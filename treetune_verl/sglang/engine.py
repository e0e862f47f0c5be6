# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Turn entropy extraction on for sglang Engines started from this process, and the arguments to start one on CPU.

The user's entry point to the sglang side (the verl side calls it too, from its server's ``launch_server``):

    from treetune_verl.sglang.engine import install
    install(top_k=0, mode="raw")          # before sglang.Engine(...)
    engine = sglang.Engine(model_path=..., ...)
    out = engine.generate(prompt, {"max_new_tokens": 32}, return_logprob=True)
    out["meta_info"]["output_token_entropy"]   # list[float], nats, one per generated token

``install`` validates the configuration, refuses any sglang but the supported versions, and hands over to the
installed version's adapter: ``v0_5_6_post2.launch`` (our scheduler entry point injected) or ``v0_5_12.launch``
(sglang's plugin seam: our entry point, switched on by ``TREETUNE_ENTROPY=1`` in the spawned processes).
Idempotent; a later call changes the configuration for Engines started after it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import check_sglang_version, installed_sglang_version

# The adapter of each supported sglang version (a newer one let through by the escape hatch takes the plugin seam).
_ADAPTERS = {"0.5.6.post2": "treetune_verl.sglang.v0_5_6_post2.launch"}
_PLUGIN_SEAM_ADAPTER = "treetune_verl.sglang.v0_5_12.launch"


def adapter() -> ModuleType:
    """The installed sglang version's ``launch`` module (``install``, ``is_installed``); raises on another version."""
    return importlib.import_module(_ADAPTERS.get(check_sglang_version(), _PLUGIN_SEAM_ADAPTER))


def install(top_k: int | None = 0, mode: str = "raw") -> EntropyConfig:
    """Enable per-token entropy for Engines created afterwards in this process; returns the configuration."""
    config = EntropyConfig(top_k=top_k, mode=mode)  # validates before touching anything
    adapter().install(config)
    return config


def is_installed() -> bool:
    return adapter().is_installed()


# Arguments under which a real sglang Engine runs on a CPU-only machine (torch-native attention,
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


# Added on the CPU per sglang version: 0.5.12 captures piecewise CUDA graphs by default
# (model_executor/piecewise_cuda_graph_runner.py: torch.cpu has no graph_pool_handle).
CPU_ENGINE_KWARGS_BY_VERSION: dict[str, dict[str, object]] = {"0.5.12": {"disable_piecewise_cuda_graph": True}}


def cpu_engine_kwargs() -> dict[str, object]:
    """:data:`CPU_ENGINE_KWARGS` plus the installed sglang version's own (read from its metadata: no import)."""
    return {**CPU_ENGINE_KWARGS, **CPU_ENGINE_KWARGS_BY_VERSION.get(installed_sglang_version(), {})}


def engine_kwargs(model_path: str, device: str = "auto", **overrides: object) -> dict[str, object]:
    """Engine arguments for ``device`` ("auto": CUDA when available, else the CPU set above)."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    kwargs: dict[str, object] = {"model_path": str(model_path)}
    if device == "cpu":
        kwargs.update(cpu_engine_kwargs())
    kwargs.update(overrides)
    return kwargs
