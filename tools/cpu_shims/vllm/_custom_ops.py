# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim: vllm's compiled custom ops, as placeholders that raise if called."""

from cpu_shim_placeholder import placeholder_getattr

__getattr__ = placeholder_getattr("vllm._custom_ops")
