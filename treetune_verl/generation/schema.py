# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The columns of a generation output: one parquet row per generated response.

Per-token lists are index-aligned (``token_ids[i]``, ``token_texts[i]``, ``logprobs[i]``, ``entropies[i]`` describe
the i-th generated token). ``entropies`` are nats, as the Engine returned them in
``meta_info["output_token_entropy"]`` (float32 in the sampler, stored as float64 so that the stored value equals the
returned Python float exactly). A response is identified by ``(prompt_id, sample_index)``.
"""

from __future__ import annotations

import pyarrow as pa

ROW_KEY = ("prompt_id", "sample_index")

RESPONSE_SCHEMA = pa.schema(
    [
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("data_source", pa.string()),
        pa.field("prompt", pa.string()),  # the last user message, for display
        pa.field("ground_truth", pa.string()),  # null when the input has none
        pa.field("response_text", pa.string()),
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("token_texts", pa.list_(pa.string())),
        pa.field("logprobs", pa.list_(pa.float64())),
        pa.field("entropies", pa.list_(pa.float64())),  # nats, one per generated token
        pa.field("finish_reason", pa.string()),  # "stop" | "length" | "abort"
        pa.field("score", pa.float64()),  # rule-based answer check (1.0 / 0.0); null when not scored
    ]
)

COLUMNS = tuple(RESPONSE_SCHEMA.names)
