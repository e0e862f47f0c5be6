# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: the generation job's rollout (``backend=verl``): verl's standalone servers with our replica and verl's
``AgentLoopManager`` with the entropy worker, ``generate_sequences(DataProto) -> DataProto`` with
``rollout_entropy``, as on verl 0.7.1.

verl 0.9.1's V1 trainer builds the servers (``LLMServerManager``) apart from the agent-loop manager and moves rows
through TransferQueue (``AgentLoopManagerTQ``), which a job that only generates has no use for; verl 0.9.1 still
ships the DataProto manager of its previous trainer (``experimental/agent_loop/agent_loop.py``:
``AgentLoopManager(config, llm_client)``, ``AgentLoopWorker``), whose worker seams are the ones our
``RolloutEntropyWorker`` overrides on verl 0.7.1 (``_agent_loop_postprocess``, ``_postprocess``). So the job runs
through the classes that carry entropy into training on both versions: our server (``EntropySGLangReplica``, given
through verl's own ``rollout_replica_class`` attribute, "for recipe to change"), our loops and entropy rows. Nothing
of the V1 trainer's seams is installed: no trainer runs here.
"""

from __future__ import annotations

# ruff: noqa: E402  (verl 0.9.1 only: the guard runs before verl's imports, which differ on verl 0.7.1)
from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("generation rollout (backend=verl)")

from typing import Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.workers.rollout.llm_server import LLMServerManager

from treetune_verl.agent_loop import entropy_single_turn_agent_loop  # noqa: F401  (registers the default loop)
from treetune_verl.agent_loop.entropy_worker import RolloutEntropyWorker
from treetune_verl.rollout.rollout_config import check_rollout_config

# What verl 0.9.1's standalone rollout needs beyond the job's composed config: its server serves
# ``rollout.load_format`` as given (``dummy`` by default: random weights), where verl 0.7.1's switched a standalone
# rollout to the real weights itself.
OVERRIDES = ["actor_rollout_ref.rollout.load_format=auto"]


class EntropyServers(LLMServerManager):
    """verl's server manager whose replicas are ours (``EntropySGLangReplica``: the entropy server)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from treetune_verl.rollout.replica import EntropySGLangReplica  # imports sglang: only where servers start

        self.rollout_replica_class = EntropySGLangReplica
        super().__init__(*args, **kwargs)


class EntropyGenerationWorker(RolloutEntropyWorker):
    """The entropy worker, defined here so that the worker's process imports this module and with it the default loop
    (``entropy_single_turn_agent``, registered on import: verl's workers look loops up by name)."""


class EntropyGenerationManager(AgentLoopManager):
    """verl's DataProto agent-loop manager with the entropy worker (``rollout_entropy``, ``has_rollout_entropy``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.agent_loop_workers_class = ray.remote(EntropyGenerationWorker)
        super().__init__(*args, **kwargs)


def start(config: Any) -> EntropyGenerationManager:
    """The servers and workers of a standalone rollout of ``config`` (verl's whole trainer config) on the running Ray
    cluster; Ray's shutdown ends them.

    Raises:
        ValueError: the rollout section cannot carry entropy (``check_rollout_config``: not sglang, no log-probs).
    """
    check_rollout_config(config.actor_rollout_ref.rollout)
    servers = EntropyServers.create(config=config)
    manager = EntropyGenerationManager.create(config=config, llm_client=servers.get_client())
    manager.servers = servers  # kept with the manager: the load balancer lives as long as the job's rollout
    return manager
