# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patch 5: sglang's tensor-reduction patch leaves CPU tensors alone.

Upstream: ``sglang/srt/utils/patch_torch.py`` (sglang 0.5.6.post2; 0.5.12 unchanged, line 72).
``monkey_patch_torch_reductions`` (called before every weight sync, ``sglang/srt/weight_sync/utils.py:update_weights``,
and in the scheduler) makes ``torch.multiprocessing.reductions.reduce_tensor`` call ``_reduce_tensor_modified``
(line 49), which rewrites element ``_REDUCE_TENSOR_ARG_DEVICE_INDEX = 6`` of the reduce tuple to the GPU's UUID.
That tuple has that element only for a CUDA tensor; a CPU tensor's tuple is shorter (``IndexError: tuple index out of range``). The replacement calls
sglang's function for CUDA tensors and torch's original ``reduce_tensor`` (kept by sglang as
``reductions._reduce_tensor_original``) for all others. ``monkey_patch_torch_reductions`` reads the module global at
call time, so replacing the global is enough; if it already ran in this process the registration is redone.
"""

from __future__ import annotations

from types import ModuleType

from verl_cpu._guard import (
    PatchError,
    is_patched,
    replacement_of,
    require_cpu_only,
    require_signature,
    require_versions,
)

PATCH = "sglang_reduce"
SUPPORTED = {"sglang": ("0.5.6.post2", "0.5.12"), "torch": ("2.13.0",)}


def apply(patch_torch: ModuleType) -> None:
    current = patch_torch._reduce_tensor_modified
    if is_patched(current):
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    require_signature(PATCH, current, ("args", "kwargs"), "sglang/srt/utils/patch_torch.py:_reduce_tensor_modified")
    if getattr(patch_torch, "_REDUCE_TENSOR_ARG_DEVICE_INDEX", None) != 6:
        raise PatchError(
            f"verl_cpu.{PATCH}: sglang/srt/utils/patch_torch.py:_REDUCE_TENSOR_ARG_DEVICE_INDEX is not 6 "
            f"(written for sglang {SUPPORTED['sglang'][0]})"
        )
    from torch.multiprocessing import reductions

    torch_reduce = getattr(reductions, "_reduce_tensor_original", reductions.reduce_tensor)
    require_signature(PATCH, torch_reduce, ("tensor",), "torch/multiprocessing/reductions.py:reduce_tensor")

    @replacement_of(current, PATCH)
    def _reduce_tensor_modified(tensor, *args, **kwargs):
        if tensor.is_cuda:
            return current(tensor, *args, **kwargs)
        return reductions._reduce_tensor_original(tensor, *args, **kwargs)

    patch_torch._reduce_tensor_modified = _reduce_tensor_modified
    if reductions.reduce_tensor is current:  # sglang's monkey patch already ran here: register the replacement
        reductions.reduce_tensor = _reduce_tensor_modified
        reductions.init_reductions()
