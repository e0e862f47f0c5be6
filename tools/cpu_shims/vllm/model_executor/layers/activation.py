# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim: sglang's own activation classes stand in for vllm's (their forward_native runs on CPU)."""

from sglang.srt.layers.activation import GeluAndMul, SiluAndMul  # noqa: F401
