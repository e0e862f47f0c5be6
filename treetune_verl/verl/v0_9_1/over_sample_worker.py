# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: every turn of a training row named after its group, so the trainer can abort a group by its uid.

On verl 0.9.1 over-sampling is decided in the trainer's process, by the replay buffer that picks the step's groups
from TransferQueue (``treetune_verl/verl/v0_9_1/over_sample_sampler.py``); what it needs from the rollout side is
that a group's requests can be aborted knowing only the group's ``uid``. Here:

- :class:`OverSamplingAgentLoopWorkerTQ` (verl's ``AgentLoopWorkerTQ``, through ``session_rows_worker.py``) runs
  each training row under :data:`~treetune_verl.agent_loop.trajectory.CURRENT_TRAJECTORY` with the session of its
  group (:func:`~treetune_verl.rollout.session.group_session_id`); validation rows run as in verl;
- :class:`SessionLLMServerClient` (verl's ``LLMServerClient``) sends each turn of such a row with the request id
  ``<group session><hex>`` (``_vllm_request_id``, the method verl keeps for choosing the id a turn is sent with;
  by default a fresh ``uuid4().hex``), so the entropy server's ``abort_sessions`` cuts all of the group's turns, queued
  or running, and answers its later turns at once, empty; the forecast's E of the group (sent under
  :data:`~treetune_verl.rollout.session.EVAL_SESSION`) gets ``<group session>eval-<hex>`` and is cut with them.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.agent_loop.trajectory import CURRENT_TRAJECTORY, PROMPT_HOOK, Trajectory
from treetune_verl.rollout.session import EVAL_SESSION, eval_request_id, group_session_id, turn_request_id
from treetune_verl.trainer.features import RunFeatures
from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("V1 over-sampling worker")  # verl 0.7.1's worker is over_sample_worker.py

from verl.workers.rollout.llm_server import LLMServerClient  # noqa: E402

from treetune_verl.verl.v0_9_1.session_rows_worker import SessionRowsWorkerTQ  # noqa: E402

__all__ = ["OverSamplingAgentLoopWorkerTQ", "SessionLLMServerClient", "session_client"]


class SessionLLMServerClient(LLMServerClient):
    """verl's client; a turn sent for a trajectory with a session gets ``<session><hex>`` as its request id, and a
    row's :data:`~treetune_verl.agent_loop.trajectory.PROMPT_HOOK` sees each turn's prompt ids before it is sent.

    ``request_id`` stays what verl uses it for (the load balancer's sticky-session key); outside a trajectory, or
    for a validation row, the turn gets verl's own id.
    """

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        hook = PROMPT_HOOK.get()
        if hook is not None:
            hook(kwargs["prompt_ids"])
        return await super().generate(request_id, **kwargs)

    def _vllm_request_id(self, request_id: str) -> str:
        trajectory = CURRENT_TRAJECTORY.get()
        if trajectory is not None:
            return turn_request_id(trajectory.session)
        eval_session = EVAL_SESSION.get()  # the forecast's E of a group: cut by the group's abort
        if eval_session is not None:
            return eval_request_id(eval_session)
        return super()._vllm_request_id(request_id)


# verl 0.9.1 workers/rollout/llm_server.py LLMServerClient.__init__: what verl builds its client from.
_CLIENT_INIT_PARAMS = ("self", "config", "load_balancer_handle", "kwargs")


def session_client(
    client: LLMServerClient, client_cls: type[SessionLLMServerClient] = SessionLLMServerClient
) -> SessionLLMServerClient:
    """A ``client_cls`` built as verl built ``client`` (its config and load balancer: all ``LLMServerClient.__init__``
    takes), which names turns by session.

    Raises:
        ValueError: ``client`` is a subclass of verl's (e.g. the fully-async client, which resumes aborted turns):
            its own request-id handling would be lost.
    """
    if type(client) is not LLMServerClient:
        raise ValueError(
            f"over-sampling names requests through verl's LLMServerClient; the trainer's client is "
            f"{type(client).__qualname__}"
        )
    VERL_CURRENT.check_signature(LLMServerClient.__init__, _CLIENT_INIT_PARAMS, "LLMServerClient.__init__")
    return client_cls(config=client.config, load_balancer_handle=client._load_balancer)


class OverSamplingAgentLoopWorkerTQ(SessionRowsWorkerTQ):
    """verl 0.9.1's TransferQueue agent-loop worker running each training row under its group's session when the run
    over-samples (``rollout.over_sample_rate > 0``; on the managed-session rows worker: one row per session here,
    over-sampling refuses more); as verl's otherwise (no session is named, none left on the servers)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not redundant: without an __init__ of its own, a subclass of an @ray.remote class (verl's is) dies in its
        # Ray actor with "super(type, obj): obj must be an instance or subtype of type" in the parent's __init__.
        super().__init__(*args, **kwargs)
        self._over_sampling = RunFeatures.from_config(self.config, rollout_entropy=True).over_sample_rate > 0

    async def _run_agent_loop(
        self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *, agent_name: str, **kwargs: Any
    ) -> Any:
        if trajectory["validate"] or not self._over_sampling:
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, **kwargs)
        group = str(kwargs["uid"])
        token = CURRENT_TRAJECTORY.set(Trajectory(session=group_session_id(group), group=group))
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, **kwargs)
        finally:
            CURRENT_TRAJECTORY.reset(token)
