# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``EntropyStore``: the per-request entropy values a scheduler process holds until they are sent.

On the entropy's path it sits between the result-handler hooks, which append one value per generated token, and
the scheduler's senders, which send the values not yet sent with each output and drop a request once its finished
output (or abort) has gone out (``scheduler_patches.py``).
"""

from __future__ import annotations

from typing import Any

# A token's entropy (nats), or in mode "support" its (entropy, support) pair (``support.StepSupport.rows``).
StoredValue = float | tuple[float, Any]


class EntropyStore:
    """Per-request entropy values (nats) with an incremental send offset, kept in the scheduler process.

    ``append`` records one value per generated token; ``get_since_offset`` returns the values not yet returned
    and advances the offset (mirroring sglang's ``send_output_token_logprobs_offset``); ``cleanup`` drops a
    request. Unknown request ids read as empty. Not thread-safe: the scheduler's event loop is one thread.
    """

    def __init__(self) -> None:
        self._values: dict[str, list[StoredValue]] = {}
        self._offsets: dict[str, int] = {}

    def append(self, rid: str, value: StoredValue) -> None:
        self._values.setdefault(rid, []).append(value if isinstance(value, tuple) else float(value))

    def get_since_offset(self, rid: str) -> list[StoredValue]:
        values = self._values.get(rid)
        if values is None:
            return []
        start = self._offsets.get(rid, 0)
        self._offsets[rid] = len(values)
        return values[start:]

    def cleanup(self, rid: str) -> None:
        self._values.pop(rid, None)
        self._offsets.pop(rid, None)

    def __len__(self) -> int:
        """Number of requests with state."""
        return len(self._values)

    def __contains__(self, rid: object) -> bool:
        return rid in self._values
