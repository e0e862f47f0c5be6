# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim: the names sglang's multimodal modules import from ``torchvision.transforms``."""

from cpu_shim_placeholder import placeholder_getattr

from .functional import InterpolationMode  # noqa: F401

__getattr__ = placeholder_getattr("torchvision.transforms")
