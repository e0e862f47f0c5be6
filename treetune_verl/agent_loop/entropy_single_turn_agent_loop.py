# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's single-turn agent loop, with the served per-token entropy carried next to the response.

On the entropy's path it sits between the server's ``EntropyTokenOutput`` (seen through ``EntropyRecorder``) and
the worker, which reads ``AgentLoopOutput.extra_fields["response_entropy"]``. Registered as
``entropy_single_turn_agent``.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from treetune_verl.agent_loop.recorder import EntropyRecorder, attach_response_entropy, attach_response_support
from treetune_verl.agent_loop.trajectory import CURRENT_TRAJECTORY
from treetune_verl.batch_keys import RESUME_KEY


@register("entropy_single_turn_agent")
class EntropySingleTurnAgentLoop(SingleTurnAgentLoop):
    """``SingleTurnAgentLoop`` whose output also holds ``extra_fields["response_entropy"]``.

    The list has one value (nats) per element of ``response_ids``: the parent generates once and truncates the
    response to ``response_length``; the entropy is truncated the same way, and so is
    ``extra_fields["response_support"]`` in entropy mode ``support``. In an over-sampled step with carry-over,
    ``extra_fields["treetune_resume"]`` holds the request's stop reason (``"abort"``: cut by over-sampling) and
    sampling parameters, which make the row resumable (``carry_over.py``); the worker pops it. Never otherwise: no
    other reader (verl 0.9.1's worker would carry it into the batch). The parent's ``run`` is reused as is:
    only ``server_manager`` is wrapped to see the server's output.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_manager = EntropyRecorder(self.server_manager, carries_support=True)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        attach_response_entropy(output, self.server_manager.take(), self.response_length)
        support = self.server_manager.take_support()
        if support is not None:  # entropy mode "support": each token's sampled support, for the actor's replay
            attach_response_support(output, support, self.response_length)
        trajectory = CURRENT_TRAJECTORY.get()
        if trajectory is not None and trajectory.step is not None and trajectory.step.carry_over:
            output.extra_fields[RESUME_KEY] = self.server_manager.resume_info()  # a cut row can be resumed
        return output
