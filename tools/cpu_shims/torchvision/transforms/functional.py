# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim: ``InterpolationMode`` as torchvision defines it; image functions raise if called."""

import enum

from cpu_shim_placeholder import placeholder_getattr


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


__getattr__ = placeholder_getattr("torchvision.transforms.functional")
