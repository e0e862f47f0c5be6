# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: what ``treetune_verl.verl.process_setup`` installs in every process that builds verl's model config.

verl 0.9.1's V1 trainer builds the rollout servers (``LLMServerManager.create`` in ``PPOTrainer._setup``,
``trainer_base.py:372``) before it loads ``rollout.agent.agent_loop_manager_class`` (``main_ppo.py``
``TaskRunnerV1.init_agent_loop_manager``), so our manager can no longer choose the server as it does on verl 0.7.1.
The first code of ours that runs in the trainer's process before the servers is ``external_lib``: verl imports it
in ``HFModelConfig.__post_init__`` (``workers/config/model.py:148``), which ``_setup`` runs first
(``_init_tokenizer``), as do the agent-loop workers (``AgentLoopWorker.__init__``) and the engine workers.
:func:`install` puts in place, in each of them:

0. the engine-worker actor's seams (``actor_seams.py``: the live forecast around ``update_actor``);
1. the entropy agent loops' names (:data:`LOOPS`) in verl's loop registry: the agent-loop workers look the
   configured names up there (on verl 0.7.1 our worker imports the loops);
2. one guarded wrap of ``LLMServerManager.__init__`` (``workers/rollout/llm_server.py:373``), which runs in the
   trainer's process only: when the config selects rollout entropy (:func:`selects_rollout_entropy`), it refuses
   what the current stack cannot run yet (``features.check_current_stack``), gives the policy's servers
   ``EntropySGLangReplica`` through verl's own attribute for it (``rollout_replica_class``, "for recipe to
   change"), and installs the V1 trainer's seams (``trainer_seams.py``). The reward model's and teacher's
   replicas are built elsewhere (``get_rollout_replica_class``) and stay verl's; a run without the block is
   untouched, except that the live forecast is refused there (its metrics need the block's trainer seams). The policy's server manager is kept (:func:`policy_server_manager`): over-sampling's replay buffer,
   in the same process, aborts groups on its servers.

Why not ``RolloutReplicaRegistry.register("sglang", ...)``: the reward model and the teacher share that entry, and a
``verl.plugins`` entry point would run in every verl process of every user who has the package installed.
"""

from __future__ import annotations

import functools
from typing import Any

from omegaconf import OmegaConf

from treetune_verl.patching import ABSENT, Replace, Wrap
from treetune_verl.verl_guard import VERL_CURRENT, installed_verl_version

__all__ = ["install", "policy_server_manager", "selects_rollout_entropy", "server_selected"]

# Signature the wrapper repeats: verl 0.9.1 workers/rollout/llm_server.py LLMServerManager.__init__.
_LLM_SERVER_MANAGER_INIT_PARAMS = (
    "self",
    "config",
    "worker_group",
    "rollout_resource_pool",
    "start_rank",
    "load_balancer_cls",
)

# Registered by name, as verl's agent_loop_config_path entries are (``{"_target_": class path}``, instantiated by
# Hydra in the agent-loop worker, which imports the loop's module there): no loop is imported where none runs.
LOOPS = {
    "entropy_single_turn_agent": "treetune_verl.agent_loop.entropy_single_turn_agent_loop.EntropySingleTurnAgentLoop",
    "entropy_tool_agent": "treetune_verl.verl.v0_9_1.entropy_tool_agent_loop.EntropyToolAgentLoop",
}

# The trainer's process's LLMServerManager whose servers are ours (one per trainer: the policy's), once built.
_POLICY_SERVER_MANAGER: Any = None


def selects_rollout_entropy(config: Any) -> bool:
    """Whether verl's whole trainer config runs our block (its manager class is ours)."""
    from treetune_verl.trainer.features import MANAGER_CLASS, MANAGER_KEY

    return OmegaConf.select(config, MANAGER_KEY, default=None) == MANAGER_CLASS


def server_selected() -> bool:
    """Whether this process built the policy's servers as ``EntropySGLangReplica`` (the trainer's, after the wrap)."""
    return _POLICY_SERVER_MANAGER is not None


def policy_server_manager() -> Any:
    """verl's ``LLMServerManager`` of the policy's entropy servers (``config``, ``server_handles``), in the process
    that built it.

    Raises:
        RuntimeError: this process built no server manager with our servers (``external_lib`` not named, or not the
            trainer's process).
    """
    if _POLICY_SERVER_MANAGER is None:
        raise RuntimeError(
            "no entropy servers were built in this process: the block's external_lib selects them in the trainer's "
            "process (treetune_verl.verl.process_setup)"
        )
    return _POLICY_SERVER_MANAGER


def _select(config: Any) -> type:
    """Refuse what cannot run, install the trainer's seams; the replica class for the policy's servers."""
    from treetune_verl.rollout.replica import EntropySGLangReplica
    from treetune_verl.rollout.rollout_config import check_rollout_config
    from treetune_verl.trainer.features import check_current_stack
    from treetune_verl.verl.v0_9_1 import trainer_seams

    check_rollout_config(config.actor_rollout_ref.rollout)
    features = check_current_stack(config, installed_verl_version())
    trainer_seams.install(features)
    return EntropySGLangReplica


def _refuse_forecast_without_block(config: Any) -> None:
    """The forecast's metrics reach the trainer as ``actor/probe/*`` (verl prefixes the actor's); the block's trainer
    seams name them back (``trainer_seams.py``), so on verl 0.9.1 the forecast runs with the block.

    Raises:
        ValueError: the forecast's key set without the block's manager.
    """
    from treetune_verl.forecast.settings import SECTION, forecast_settings
    from treetune_verl.trainer.features import MANAGER_CLASS, MANAGER_KEY

    rollout = OmegaConf.select(config, "actor_rollout_ref.rollout", default=None)
    if rollout is not None and forecast_settings(rollout) is not None:
        raise ValueError(
            f"{SECTION} on verl {installed_verl_version()} runs with rollout entropy ({MANAGER_KEY}={MANAGER_CLASS}, "
            "the +treetune=rollout_entropy block): its trainer seams report the forecast's probe/* metrics"
        )


def _wrap_llm_server_manager_init(original):
    def __init__(self, config, worker_group=None, rollout_resource_pool=None, start_rank=0, load_balancer_cls=None):
        global _POLICY_SERVER_MANAGER
        if not selects_rollout_entropy(config):
            _refuse_forecast_without_block(config)
        elif not hasattr(self, "rollout_replica_class"):
            self.rollout_replica_class = _select(config)
            _POLICY_SERVER_MANAGER = self
        original(self, config, worker_group, rollout_resource_pool, start_rank, load_balancer_cls)

    return __init__


def install() -> None:
    """Install the engine-worker actor's seams (``actor_seams.py``: the forecast), register the entropy loops and wrap
    ``LLMServerManager.__init__`` in this process (idempotent).

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    from verl.experimental.agent_loop import agent_loop
    from verl.workers.rollout import llm_server

    from treetune_verl.verl.v0_9_1 import actor_seams

    VERL_CURRENT.require("server selection")
    actor_seams.install()
    VERL_CURRENT.wrap(
        Wrap(llm_server.LLMServerManager, "__init__", _wrap_llm_server_manager_init, _LLM_SERVER_MANAGER_INIT_PARAMS)
    )
    VERL_CURRENT.replace(
        *(
            Replace(
                agent_loop._agent_loop_registry,
                name,
                lambda _, target=target: {"_target_": target},
                functools.partial(_free_or_ours, target=target),
                why="an entry of verl's loop registry (data: what its @register writes, agent_loop.py:475)",
                where=f"agent_loop._agent_loop_registry[{name!r}]",
            )
            for name, target in LOOPS.items()
        )
    )


def _free_or_ours(entry: Any, target: str) -> str | None:
    """A loop name not registered yet, or registered to our class already (another install in this process)."""
    if entry is ABSENT or entry == {"_target_": target}:
        return None
    return f"is registered to {entry!r}, not {target}: another loop took our name"
