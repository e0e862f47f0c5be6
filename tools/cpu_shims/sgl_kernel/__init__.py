# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim for ``sgl_kernel`` (sglang's CUDA kernel wheel, ~1.6 GB, sm90/sm100 only).

sglang 0.5.6.post2 imports it at module level even on CPU (e.g. ``from sgl_kernel import silu_and_mul`` in
``layers/moe/moe_runner/deep_gemm.py``). Every attribute and every submodule (``sgl_kernel.flash_attn`` ...)
resolves to a placeholder that raises when called. No ``torch.ops.sgl_kernel`` op is registered, so sglang's
``cpu_has_amx_support()`` reports False and the CPU paths use torch-native code. Test/CPU setup only.
"""

from cpu_shim_placeholder import install_submodule_finder, placeholder_getattr

__version__ = "0.0.0+cpu-shim"


__getattr__ = placeholder_getattr("sgl_kernel")


install_submodule_finder("sgl_kernel")
