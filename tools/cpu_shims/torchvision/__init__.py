# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim for ``torchvision``: PyPI has no CPU build for torch 2.13.0 (the CUDA build fails at import).

sglang 0.5.6.post2 imports ``torchvision.transforms`` from multimodal configs (``multimodal/internvl_utils.py``)
while loading any model config: ``transforms`` and its ``InterpolationMode`` are shipped here. sglang 0.5.12 imports
``torchvision.io`` at start-up (``srt/utils/common.py:90``), and transformers 5.x, seeing torchvision installed,
imports ``torchvision.transforms.v2`` and ``io``: every submodule not shipped here imports as placeholders that raise
if called. Test/CPU setup only.
"""

from cpu_shim_placeholder import install_submodule_finder

from . import transforms  # noqa: F401

__version__ = "0.0.0+cpu-shim"

install_submodule_finder("torchvision")
