# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim for ``vllm``: only the three modules sglang 0.5.6.post2 imports on non-AMX CPUs.

``layers/activation.py`` and ``layers/layernorm.py`` fall back to vllm's ``SiluAndMul``/``GeluAndMul`` and
``RMSNorm``/``GemmaRMSNorm``; the shim hands back sglang's own classes, whose ``forward_native`` runs on CPU.
``layers/rotary_embedding.py`` imports ``vllm._custom_ops.rotary_embedding`` (a placeholder). Test/CPU setup only.
"""

__version__ = "0.0.0+cpu-shim"
