# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl's per-micro-batch rollout-correction metrics on a micro-batch of aborted rows: no metrics, not a crash.

verl 0.7.1's legacy actor computes, for every micro-batch that carries ``rollout_log_probs`` (always, with
``rollout.calculate_log_probs=True``, which our block sets), ``compute_rollout_corr_metrics_from_logprobs``
(``verl/workers/actor/dp_actor.py:631``, imported from ``verl/trainer/ppo/rollout_corr_helper.py`` at each call), and
its ``compute_offpolicy_metrics`` asserts ``response_mask.any()`` (``rollout_corr_helper.py:870``): a micro-batch whose
rows are all aborted (empty responses) stops training with ``AssertionError: Expected at least one valid token in
response_mask``. Measured in the e2e run with one row per micro-batch. The wrapper returns no metric for such a
micro-batch (the per-micro-batch metrics are lists appended to; an empty micro-batch adds nothing) and calls verl's
function unchanged otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

from treetune_verl.patching import replace_attr
from treetune_verl.verl_guard import check_signature, require_verl

# verl 0.7.1 trainer/ppo/rollout_corr_helper.py compute_rollout_corr_metrics_from_logprobs
ROLLOUT_CORR_METRICS_PARAMS = ("log_prob", "rollout_log_prob", "response_mask")


def _wrap(original: Any) -> Any:
    def compute_rollout_corr_metrics_from_logprobs(
        log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
    ) -> dict[str, float]:
        if not bool(response_mask.any()):
            return {}
        return original(log_prob, rollout_log_prob, response_mask)

    return compute_rollout_corr_metrics_from_logprobs


def install() -> None:
    """Install the guard in this process (idempotent).

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature.
    """
    from verl.trainer.ppo import rollout_corr_helper

    require_verl("rollout-correction metrics guard")
    check_signature(
        rollout_corr_helper.compute_rollout_corr_metrics_from_logprobs,
        ROLLOUT_CORR_METRICS_PARAMS,
        "rollout_corr_helper.compute_rollout_corr_metrics_from_logprobs",
    )
    replace_attr(rollout_corr_helper, "compute_rollout_corr_metrics_from_logprobs", _wrap)
