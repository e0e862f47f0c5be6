# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""One file per forecast with E's per-token values, for studies that recompute estimators offline.

With ``entropy_forecast.record_dir`` set, each forecast writes ``<record_dir>/forecast_<call>_rank<r>.pt`` (``torch.save``
of a dict of CPU tensors and floats): E (its probe batch: token ids, masks, prompt lengths), its response mask, the per-token log-probabilities and entropies at θ, θ′ = θ + Δθ
(after verl's first optimizer step) and θ − Δθ (central differences only), after the whole update when it took more
than one optimizer step, each estimator's surrogate coefficients ∂L/∂lp and ∂L/∂H at θ, and the forecast's metrics.
Shapes ``[B, G, R]`` fp64 (this rank's B prompts of E, G responses, R response columns); nats.

A few kilobytes per forecast at the CPU study's E (2 prompts x 2 responses x 64 tokens).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from treetune_verl.probe.teacher_forcing import TeacherForced


def values(tf: TeacherForced | None) -> dict[str, torch.Tensor]:
    """``{"lp": [B, G, R], "H": [B, G, R]}`` (fp64 CPU) of one teacher-forced pass; empty for None."""
    if tf is None:
        return {}
    return {"lp": tf.token_logprobs.detach().double().cpu(), "H": tf.entropies.detach().double().cpu()}


def write_record(directory: str | os.PathLike, call: int, rank: int, record: dict[str, Any]) -> Path:
    """``record`` saved as ``<directory>/forecast_<call:05d>_rank<rank>.pt`` (written to a temporary name and renamed:
    a reader sees a whole file or none); returns its path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"forecast_{call:05d}_rank{rank}.pt"
    partial = path.with_suffix(f".pt.{os.getpid()}.partial")
    torch.save(record, partial)
    partial.replace(path)
    return path


def read_records(directory: str | os.PathLike, rank: int = 0) -> list[dict[str, Any]]:
    """Every record rank ``rank`` wrote in ``directory``, in call order."""
    paths = sorted(Path(directory).glob(f"forecast_*_rank{rank}.pt"))
    return [torch.load(p, weights_only=False) for p in paths]
