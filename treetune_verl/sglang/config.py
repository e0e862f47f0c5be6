# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What the scheduler computes: ``EntropyConfig`` (top-k, mode) and its crossing of sglang's spawn boundary.

First stop on the entropy's path: ``install()`` builds an :class:`EntropyConfig` in the parent and exports it as
environment variables, which sglang's spawned scheduler process inherits and reads back with
:meth:`EntropyConfig.from_env` before the patched Sampler exists.

    TREETUNE_ENTROPY         1 = entropy is on for the sglang processes that inherit it (sglang >= 0.5.12: our
                             ``sglang.srt.plugins`` entry point is inert without it; set by ``install()``)
    TREETUNE_ENTROPY_TOP_K   0 (default) = full vocabulary; k > 0 = entropy of the renormalised top-k
    TREETUNE_ENTROPY_MODE    raw (default): softmax(logits) before temperature;
                             tempered: softmax(logits / T) with each request's temperature T, the distribution
                             that sglang's returned logprobs and verl's actor entropy refer to (top-p/top-k/min-p
                             truncation of the sampler is not applied in either mode);
                             support: the entropy of the distribution each token was sampled from, renormalised over
                             the support the request's own top-k/top-p/min-p left (sglang's sampler, read where it
                             samples: ``support_capture.py``), and that support with each token
                             (``meta_info["output_token_support"]``)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

ENV_ENABLED = "TREETUNE_ENTROPY"
ENV_TOP_K = "TREETUNE_ENTROPY_TOP_K"
ENV_MODE = "TREETUNE_ENTROPY_MODE"
EntropyMode = Literal["raw", "tempered", "support"]
# Key added to each scheduler's internal state (Engine.get_server_info()["internal_states"][i]), both sglang versions:
# the number of requests whose entropy the scheduler still holds; 0 once every request has finished or been aborted.
INTERNAL_STATE_KEY = "treetune_entropy_requests"
ENTROPY_MODES: tuple[str, ...] = ("raw", "tempered", "support")


def validate_top_k(top_k: object) -> int | None:
    """``top_k`` as ``None`` (full vocabulary, also for 0) or a positive int; raises for anything else."""
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ValueError(f"top_k must be a non-negative int or None, got {top_k!r} ({type(top_k).__name__})")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = full vocabulary), got {top_k}")
    return top_k or None


@dataclasses.dataclass(frozen=True)
class EntropyConfig:
    """What the scheduler computes. ``top_k=None`` is the full vocabulary."""

    top_k: int | None = None
    mode: EntropyMode = "raw"

    def __post_init__(self) -> None:
        object.__setattr__(self, "top_k", validate_top_k(self.top_k))
        if self.mode not in ENTROPY_MODES:
            raise ValueError(f"entropy mode must be one of {ENTROPY_MODES}, got {self.mode!r}")
        if self.mode == "support" and self.top_k is not None:
            raise ValueError(
                f"top_k={self.top_k} with mode 'support': the support is the one the request's own top-k/top-p/min-p "
                "left in sglang's sampler; top_k is the other modes' truncation of the entropy. Set top_k=0."
            )

    @classmethod
    def from_env(cls) -> EntropyConfig:
        raw_k = os.environ.get(ENV_TOP_K, "0").strip() or "0"
        try:
            top_k = int(raw_k)
        except ValueError:
            raise ValueError(
                f"{ENV_TOP_K} must be a non-negative integer (0 = full vocabulary), got {raw_k!r}"
            ) from None
        mode = os.environ.get(ENV_MODE, "raw").strip() or "raw"
        return cls(top_k=top_k, mode=mode)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        return {ENV_ENABLED: "1", ENV_TOP_K: str(self.top_k or 0), ENV_MODE: self.mode}

    def export(self) -> None:
        """Put this configuration (and the switch) into ``os.environ`` so that spawned scheduler processes inherit it."""
        os.environ.update(self.to_env())


def enabled_in_env() -> bool:
    """Whether this process was started with entropy on (``TREETUNE_ENTROPY=1``, inherited from ``install()``)."""
    return os.environ.get(ENV_ENABLED, "").strip() == "1"
