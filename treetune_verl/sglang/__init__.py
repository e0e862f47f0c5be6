# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""sglang 0.5.6.post2 integration: per-token sampling entropy (see treetune_specs/2026-11-22-sglang-entropy-extraction.md)."""
