# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Per-token sampling entropy from sglang 0.5.6.post2: the public engine-side API.

One entropy value (nats) per generated token reaches ``meta_info["output_token_entropy"]``, aligned
index-for-index with ``meta_info["output_token_logprobs"]`` (returned only with ``return_logprob=True``).
Spec: ``treetune_specs/2026-11-22-sglang-entropy-extraction.md``; patch points: ``agent-docs/sglang-engine-guide.md``.

Public names:
    compute_entropy(logits, top_k=None)      entropy of softmax(logits) per row, float32
    EntropyStore                             per-request values with a send offset (scheduler process)
    EntropyConfig                            top-k and mode, crossing the spawn boundary as env vars
    custom_run_scheduler_process(...)        sglang's run_scheduler_process, with our patches applied first
    apply_parent_patches()                   TokenizerManager patches in the process that owns the Engine

Configuration crosses the spawn boundary as environment variables read in the scheduler process:
    TREETUNE_ENTROPY_TOP_K   0 (default) = full vocabulary; k > 0 = entropy of the renormalised top-k
    TREETUNE_ENTROPY_MODE    raw (default): softmax(logits) before temperature;
                             tempered: softmax(logits / T) with each request's temperature T, the distribution
                             that sglang's returned logprobs and verl's actor entropy refer to (top-p/top-k/min-p
                             truncation of the sampler is not applied in either mode)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

import torch

ENV_TOP_K = "TREETUNE_ENTROPY_TOP_K"
ENV_MODE = "TREETUNE_ENTROPY_MODE"
EntropyMode = Literal["raw", "tempered"]
ENTROPY_MODES: tuple[str, ...] = ("raw", "tempered")


def _validate_top_k(top_k: object) -> int | None:
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ValueError(f"top_k must be a non-negative int or None, got {top_k!r} ({type(top_k).__name__})")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = full vocabulary), got {top_k}")
    return top_k or None


@torch.no_grad()
def compute_entropy(logits: torch.Tensor, top_k: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) along the last dimension, in nats, accumulated in float32.

    Shape notation: ``N`` = rows (batch), ``V`` = vocabulary.

    Args:
        logits: ``[N, V]`` (or any ``[..., V]``) in any float dtype. ``-inf`` entries are masked tokens: the
            result is the entropy over the remaining support. A row that is entirely ``-inf`` or contains NaN
            has no distribution and gives NaN for that row (never a silent number).
        top_k: ``None`` or ``0`` = full vocabulary. ``k > 0`` = entropy of the distribution renormalised over
            the ``k`` largest logits (``k >= V`` is the full vocabulary). Always ``<= log(k)``.

    Returns:
        ``[N]`` (or ``[...]``) float32 entropies in nats.

    Raises:
        ValueError: for a negative or non-integer ``top_k``.
    """
    top_k = _validate_top_k(top_k)
    logits = logits.float()
    if top_k is not None and top_k < logits.shape[-1]:
        logits = torch.topk(logits, top_k, dim=-1, sorted=False).values
    # Two [N, V] temporaries and in-place ops: this runs on the sampler's hot path at every decode step.
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    # Masked tokens have p = 0 and logp = -inf, whose product is NaN; clamping logp to the most negative finite
    # float makes their term 0 (as sglang does for its logprobs). NaN survives the clamp, so a row that is all
    # -inf (log_softmax gives NaN throughout) or that contains NaN stays NaN.
    logp.clamp_(min=torch.finfo(logp.dtype).min)
    return -p.mul_(logp).sum(dim=-1)


class EntropyStore:
    """Per-request entropy values (nats) with an incremental send offset, kept in the scheduler process.

    ``append`` records one value per generated token; ``get_since_offset`` returns the values not yet returned
    and advances the offset (mirroring sglang's ``send_output_token_logprobs_offset``); ``cleanup`` drops a
    request. Unknown request ids read as empty. Not thread-safe: the scheduler's event loop is one thread.
    """

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = {}
        self._offsets: dict[str, int] = {}

    def append(self, rid: str, value: float) -> None:
        self._values.setdefault(rid, []).append(float(value))

    def get_since_offset(self, rid: str) -> list[float]:
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


@dataclasses.dataclass(frozen=True)
class EntropyConfig:
    """What the scheduler computes. ``top_k=None`` is the full vocabulary."""

    top_k: int | None = None
    mode: EntropyMode = "raw"

    def __post_init__(self) -> None:
        object.__setattr__(self, "top_k", _validate_top_k(self.top_k))
        if self.mode not in ENTROPY_MODES:
            raise ValueError(f"entropy mode must be one of {ENTROPY_MODES}, got {self.mode!r}")

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
        return {ENV_TOP_K: str(self.top_k or 0), ENV_MODE: self.mode}

    def export(self) -> None:
        """Put this configuration into ``os.environ`` so that spawned scheduler processes inherit it."""
        os.environ.update(self.to_env())


def custom_run_scheduler_process(
    server_args,
    port_args,
    gpu_id: int,
    tp_rank: int,
    moe_ep_rank: int,
    pp_rank: int,
    dp_rank: int | None,
    pipe_writer,
):
    """sglang's ``run_scheduler_process`` with the entropy patches applied first, in the spawned process.

    Same signature as ``sglang.srt.managers.scheduler.run_scheduler_process`` (0.5.6.post2). Injected as
    ``sglang.srt.entrypoints.engine.run_scheduler_process`` by :func:`treetune_verl.sglang.engine.install`;
    must stay a top-level function of an importable module so that ``spawn`` can pickle it.
    """
    from treetune_verl.sglang.scheduler_patches import apply_scheduler_patches

    apply_scheduler_patches(EntropyConfig.from_env(), server_args)
    from sglang.srt.managers import scheduler

    return scheduler.run_scheduler_process(
        server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank, pipe_writer
    )


def apply_parent_patches() -> None:
    """Patch sglang's TokenizerManager in this process so ``meta_info`` carries ``output_token_entropy``."""
    from treetune_verl.sglang.tokenizer_patches import apply_tokenizer_patches

    apply_tokenizer_patches()
