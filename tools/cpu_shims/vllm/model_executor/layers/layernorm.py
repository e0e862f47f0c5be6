# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU import shim: sglang's own norm classes stand in for vllm's (their forward_native runs on CPU)."""

from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm  # noqa: F401
