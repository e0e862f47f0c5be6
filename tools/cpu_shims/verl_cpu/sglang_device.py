# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patch 3: ``ServerArgs`` without a device resolves to ``"cpu"`` when there is no accelerator.

Upstream: ``sglang/srt/server_args.py``, ``ServerArgs._handle_missing_default_values`` (sglang 0.5.6.post2 line 722,
0.5.12 line 1171) calls ``get_device()`` (imported by name from ``sglang/srt/utils/common.py:get_device``), which raises
``RuntimeError: No accelerator (CUDA, XPU, HPU, NPU) is available.`` unless ``SGLANG_USE_CPU_ENGINE=1`` (which would
switch sglang to ``sgl_kernel`` CPU ops that the import shims do not provide). verl's trainer-side adapter builds such
a ``ServerArgs`` (``verl/workers/rollout/sglang_rollout/http_server_engine.py:255``, ``HttpServerAdapter.__init__``).
The replacement of ``server_args.get_device`` calls the original and returns ``"cpu"`` only when it raises that
error and torch sees no CUDA.
"""

from __future__ import annotations

from types import ModuleType

from verl_cpu._guard import is_patched, replacement_of, require_cpu_only, require_signature, require_versions

PATCH = "sglang_device"
SUPPORTED = {"sglang": ("0.5.6.post2", "0.5.12")}
NO_ACCELERATOR = "No accelerator"


def apply(server_args: ModuleType) -> None:
    current = server_args.get_device
    if is_patched(current):
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    require_signature(PATCH, current, ("device_id",), "sglang/srt/utils/common.py:get_device")

    @replacement_of(current, PATCH)
    def get_device(device_id=None):
        try:
            return current(device_id)
        except RuntimeError as error:
            import torch

            if NO_ACCELERATOR in str(error) and not torch.cuda.is_available():
                return "cpu"
            raise

    server_args.get_device = get_device
