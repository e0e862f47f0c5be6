# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim for ``torchvision``: PyPI has no CPU build for torch 2.13.0 (the CUDA build fails at import).

sglang 0.5.6.post2 imports ``torchvision.transforms`` from multimodal configs (``multimodal/internvl_utils.py``)
while loading any model config. Only ``transforms`` and ``InterpolationMode`` exist. Test/CPU setup only.
"""

from . import transforms  # noqa: F401

__version__ = "0.0.0+cpu-shim"
