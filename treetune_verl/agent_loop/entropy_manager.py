# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's ``AgentLoopManager`` serving entropy-carrying rollouts, plus the per-step entropy metrics.

Selected without modifying verl by ``+actor_rollout_ref.rollout.agent.agent_loop_manager_class=
treetune_verl.agent_loop.EntropyAgentLoopManager`` (``ray_trainer.py:823-844`` loads it by name). ``rollout.name``
stays ``sglang``: the FSDP workers look the name up in their own registry (``workers/rollout/base.py:83-101``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, _get_rollout_and_model_config
from verl.protocol import DataProto

from treetune_verl.agent_loop.entropy_output import CONFIG_PATH, ROLLOUT_ENTROPY_KEY, check_rollout_config
from treetune_verl.agent_loop.entropy_worker import EntropyAgentLoopWorker

METRIC_PREFIX = "agent_loop/rollout_entropy"


def rollout_entropy_metrics(entropy: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """Mean, median, 90th percentile and maximum of the entropy (nats) over model-generated tokens.

    Shape notation: ``B`` = batch, ``R`` = response_length.

    Args:
        entropy: ``[B, R]`` float, ``batch["rollout_entropy"]``.
        response_mask: ``[B, R]`` 0/1, ``batch["response_mask"]``; only tokens with 1 count (all pooled together,
            so a long response weighs more than a short one).

    Returns:
        ``{"agent_loop/rollout_entropy/{mean,p50,p90,max}": float}`` (percentiles linearly interpolated, as
        ``numpy.percentile``), or ``{}`` when no token is masked in.
    """
    values = entropy[response_mask.bool()].double().cpu().numpy()
    if values.size == 0:
        return {}
    p50, p90 = np.percentile(values, [50, 90])
    return {
        f"{METRIC_PREFIX}/mean": float(values.mean()),
        f"{METRIC_PREFIX}/p50": float(p50),
        f"{METRIC_PREFIX}/p90": float(p90),
        f"{METRIC_PREFIX}/max": float(values.max()),
    }


class EntropyAgentLoopManager(AgentLoopManager):
    """``AgentLoopManager`` with the entropy replica and worker, refusing unusable settings before any server starts.

    The replica (``EntropySGLangReplica``) and worker (``EntropyAgentLoopWorker``) classes are set before
    ``super().__init__``, through verl's own hook (it keeps attributes that already exist); a subclass may set
    ``rollout_replica_class`` / ``agent_loop_workers_class`` itself.

    Metrics: verl's trainer logs nothing from the rollout output except ``meta_info["timing"]``, which
    ``ray_trainer.fit`` merges into ``timing_raw`` and logs as ``timing_s/<key>`` (``compute_timing_metrics``), the
    path verl's own ``agent_loop/*`` statistics take. ``_performance_metrics`` adds
    ``agent_loop/rollout_entropy/{mean,p50,p90,max}`` there, so they reach every configured logger as
    ``timing_s/agent_loop/rollout_entropy/...``.

    Raises:
        ValueError: ``rollout.name`` is not ``sglang``, ``calculate_log_probs`` is off, or the entropy section is
            invalid.
        UnsupportedSGLangError: data-parallel sglang, speculative decoding (MTP), pipeline parallelism or
            disaggregation.
    """

    def __init__(
        self,
        config: DictConfig,
        worker_group: Any = None,
        rollout_resource_pool: Any = None,
        reward_loop_worker_handles: list[Any] | None = None,
    ) -> None:
        rollout_config, _ = _get_rollout_and_model_config(config)
        if rollout_config.get("name") != "sglang":
            raise ValueError(
                f"{CONFIG_PATH}.name must be sglang for rollout entropy (got {rollout_config.get('name')!r}); the "
                "entropy server is selected by this manager, not by the rollout name"
            )
        check_rollout_config(rollout_config)
        if not hasattr(self, "rollout_replica_class"):
            # Imported here: it imports sglang, which only the processes that start servers need.
            from treetune_verl.sglang.server import EntropySGLangReplica

            self.rollout_replica_class = EntropySGLangReplica
        if not hasattr(self, "agent_loop_workers_class"):
            self.agent_loop_workers_class = ray.remote(EntropyAgentLoopWorker)
        super().__init__(config, worker_group, rollout_resource_pool, reward_loop_worker_handles)

    def _performance_metrics(self, metrics: list[list[dict[str, Any]]], output: DataProto) -> dict[str, float]:
        timing = super()._performance_metrics(metrics, output)
        timing.update(rollout_entropy_metrics(output.batch[ROLLOUT_ENTROPY_KEY], output.batch["response_mask"]))
        return timing
