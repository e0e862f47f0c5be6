# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""A probe for ``treetune_tests/e2e/test_entropy_e2e.sh`` (``E2E_PROBE=1``): what the trainer receives from a rollout.

``ProbedEntropyAgentLoopManager`` is ``EntropyAgentLoopManager`` unchanged, except that, where the manager computes
its per-step metrics from the concatenated rollout (the ``DataProto`` that ``generate_sequences`` returns to
``RayPPOTrainer.fit``), it also writes one JSON record per rollout to ``$TREETUNE_E2E_PROBE_DIR``. The e2e script
selects it by one override placed after the README block and checks the records (``check_metrics.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from verl.protocol import DataProto

from treetune_verl.agent_loop import ROLLOUT_ENTROPY_KEY
from treetune_verl.verl import EntropyAgentLoopManager

PROBE_DIR_ENV = "TREETUNE_E2E_PROBE_DIR"


def describe_rollout(output: DataProto) -> dict[str, Any]:
    """Shape, dtype and alignment of ``rollout_entropy`` in a rollout batch (JSON-serialisable)."""
    entropy = output.batch[ROLLOUT_ENTROPY_KEY]
    mask = output.batch["response_mask"].bool()
    return {
        "shape": list(entropy.shape),
        "dtype": str(entropy.dtype),
        "batch_size": len(output),
        "response_length": int(output.batch["responses"].shape[1]),
        "model_tokens": int(mask.sum()),
        "nonzero_off_mask": int((entropy[~mask] != 0).sum()),
        "zero_on_mask": int((entropy[mask] == 0).sum()),
        "finite": bool(torch.isfinite(entropy).all()),
        "non_tensor_keys": sorted(output.non_tensor_batch),
    }


class ProbedEntropyAgentLoopManager(EntropyAgentLoopManager):
    """``EntropyAgentLoopManager`` that records :func:`describe_rollout` of every rollout it returns."""

    def _performance_metrics(self, metrics: list[list[dict[str, Any]]], output: DataProto) -> dict[str, float]:
        timing = super()._performance_metrics(metrics, output)
        probe_dir = os.environ.get(PROBE_DIR_ENV)
        if probe_dir:
            record = {**describe_rollout(output), "metrics": {k: v for k, v in timing.items() if "entropy" in k}}
            path = Path(probe_dir)
            path.mkdir(parents=True, exist_ok=True)
            index = len(list(path.glob("rollout_*.json")))
            (path / f"rollout_{index:03d}.json").write_text(json.dumps(record, indent=1))
        return timing
