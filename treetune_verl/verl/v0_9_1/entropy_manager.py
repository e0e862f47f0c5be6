# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1's ``AgentLoopManagerTQ`` for the rollout-entropy block: what the block's manager class is on the current stack.

verl 0.9.1's V1 trainer builds the servers before it loads this class, so the server is selected earlier, through
``external_lib`` (``treetune_verl/verl/v0_9_1/process_setup.py``), and the entropy reaches the trainer through the
rows' ``extra_fields`` (the V1 seams build ``rollout_entropy`` there). This manager refuses a run where that did
not happen, before any rollout: without it the stock server would serve rows without entropy. With over-sampling
(``rollout.over_sample_rate > 0``) its workers run each training row under its group's session
(``over_sample_worker.py``), which the trainer's replay buffer aborts by uid; with carry-over their client
resumes a turn cut by the pause around a weight update (``resuming_client.py``). Its workers always put each row of
a managed session into TransferQueue as a row of its group, and refuse a session of another number of rows than
``rollout.custom.managed.rows_per_session`` (``session_rows_worker.py``). With the live forecast
(``rollout.custom.entropy_forecast``) it marks E's uids on the training calls the forecast is due at
(:attr:`rollout_eval`, the same schedule as verl 0.7.1's manager); its workers sample E beside those rows
(``forecast_eval_worker.py``) and the trainer's ``_update_actor`` seam takes it for the actor
(``verl/v0_9_1/rollout_eval.py``). Its workers combine every feature in one class (``worker.py``).
"""

from __future__ import annotations

from typing import Any

import ray

from treetune_verl.batch_keys import FORECAST_EVAL_PLAN_KEY
from treetune_verl.forecast.rollout_eval import RolloutEval
from treetune_verl.trainer.features import EXTERNAL_LIB_KEY, MANAGER_KEY, PROCESS_SETUP_MODULE, RunFeatures
from treetune_verl.verl.v0_9_1.process_setup import server_selected
from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("V1 agent-loop manager")  # verl 0.7.1 has no V1 trainer: its manager is entropy_manager.py

from verl.trainer.ppo.v1 import AgentLoopManagerTQ  # noqa: E402

from treetune_verl.verl.v0_9_1.over_sample_worker import session_client  # noqa: E402
from treetune_verl.verl.v0_9_1.worker import EntropyAgentLoopWorkerTQ  # noqa: E402


class EntropyAgentLoopManager(AgentLoopManagerTQ):
    """verl's V1 agent-loop manager, refusing to run unless the policy's servers are the entropy servers.

    Raises:
        ValueError: ``external_lib`` does not name our entry point (naming both keys).
    """

    def __init__(self, config: Any, llm_client: Any, *args: Any, **kwargs: Any) -> None:
        if not server_selected():
            raise ValueError(
                f"{MANAGER_KEY} on verl 0.9.1 needs {EXTERNAL_LIB_KEY}={PROCESS_SETUP_MODULE}: verl builds the "
                "rollout servers before it loads the manager, and that module selects the entropy server then"
            )
        features = RunFeatures.from_config(config, rollout_entropy=True)
        if features.over_sample_rate > 0 and features.carry_over:
            from treetune_verl.verl.v0_9_1.resuming_client import resuming_client

            llm_client = resuming_client(llm_client)
        elif features.over_sample_rate > 0 or features.forecast is not None:
            # turns named by group session (over-sampling), the row's prompt hook called (the forecast's E)
            llm_client = session_client(llm_client)
        super().__init__(config, llm_client, *args, **kwargs)
        # after verl's __init__, which sets its own worker class: ours, every worker-side feature in a stated order
        self.agent_loop_workers_class = ray.remote(EntropyAgentLoopWorkerTQ)
        self.rollout_eval = (
            RolloutEval(features.forecast, config.actor_rollout_ref.rollout) if features.forecast is not None else None
        )

    def generate_sequences(self, prompts: Any) -> None:
        """verl's dispatch of ``prompts`` (a ``TensorDict``) to the workers; on a training call the forecast is due
        at, E's uids marked first (``FORECAST_EVAL_PLAN_KEY``: a column the workers take off each prompt)."""
        if self.rollout_eval is not None:
            from verl.utils import tensordict_utils as tu

            validate = bool(tu.get(prompts, "validate", default=False))
            if self.rollout_eval.training_call_due(not validate):
                plans = self.rollout_eval.plans([str(uid) for uid in tu.get(prompts, "uid")])
                tu.assign_non_tensor_stack(prompts, FORECAST_EVAL_PLAN_KEY, plans)
        return super().generate_sequences(prompts)
