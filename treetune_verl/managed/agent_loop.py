# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy_managed_agent``: a verl agent loop that hands a :class:`ManagedServer` to a user's async agent function.

The agent function is named by an import path, ``"package.module:function"`` (or ``package.module.function``):

- the ``agent_fn`` key of the loop's entry in an ``agent_loop_config_path`` YAML (Hydra instantiates the loop with
  it), or
- ``actor_rollout_ref.rollout.custom.managed.agent_fn`` (``+actor_rollout_ref.rollout.custom.managed.agent_fn=...``).

It is called as ``await agent_fn(managed, messages, **sample)`` with ``messages`` the dataset row's ``raw_prompt``
and ``sample`` the row's other fields (``extra_info``, ``tools_kwargs``, ``index``, ...), and returns the
:class:`SequenceNode` to train on, or ``None`` for the first choice of its last call (``managed.last_node``).
That node becomes the ``AgentLoopOutput``: ``prompt_ids`` up to its first model turn, the rest as the response
(``response_mask`` 1 at model tokens, ``response_logprobs`` and ``extra_fields["response_entropy"]`` the served
values there and 0.0 elsewhere), truncated to ``response_length`` as verl's loops truncate. The worker then puts the
entropy into ``batch["rollout_entropy"]`` exactly as for the other entropy loops.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from treetune_verl.agent_loop.recorder import attach_response_entropy
from treetune_verl.managed.backends import VerlBackend
from treetune_verl.managed.node import SequenceNode
from treetune_verl.managed.server import ManagedServer
from treetune_verl.rollout.rollout_config import CONFIG_PATH

AgentFn = Callable[..., Awaitable[SequenceNode | None]]
AGENT_FN_KEY = f"{CONFIG_PATH}.custom.managed.agent_fn"


def load_agent_fn(path: str) -> AgentFn:
    """The callable at ``"module:function"`` or ``"module.function"``; raises naming the path."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"agent_fn {path!r} is not an import path 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"agent_fn {path!r} cannot be imported: {error}") from error
    if not callable(fn):
        raise ValueError(f"agent_fn {path!r} is not callable")
    return fn


@register("entropy_managed_agent")
class ManagedAgentLoop(AgentLoopBase):
    """Runs one managed session per sample; see the module docstring for the agent function's contract."""

    def __init__(self, *args: Any, agent_fn: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        custom = self.rollout_config.get("custom") or {}
        path = agent_fn or (custom.get("managed") or {}).get("agent_fn")
        if not path:
            raise ValueError(
                f"entropy_managed_agent needs an agent function: set +{AGENT_FN_KEY}=package.module:function or the "
                "agent_fn key of its agent_loop_config_path entry"
            )
        self.agent_fn = load_agent_fn(path)
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length
        max_model_len = self.rollout_config.get("max_model_len")
        self.context_length = int(max_model_len or self.prompt_length + self.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        messages = list(kwargs.pop("raw_prompt"))
        backend = VerlBackend(self.server_manager, self.context_length, default_sampling=sampling_params)
        async with ManagedServer(
            backend, tokenizer=self.tokenizer, chat_template_kwargs=self.apply_chat_template_kwargs
        ) as managed:
            node = await self.agent_fn(managed, messages, **kwargs)
            node = node if node is not None else managed.last_node
        if node is None:
            raise RuntimeError(f"agent_fn {self.agent_fn.__qualname__} made no call: there is nothing to train on")
        return self.to_output(node)

    def to_output(self, node: SequenceNode) -> AgentLoopOutput:
        """``node`` as verl's ``AgentLoopOutput`` (response truncated to ``response_length``)."""
        view = node.to_verl()
        if len(view["prompt_ids"]) > self.prompt_length:
            raise ValueError(
                f"the managed session's first prompt has {len(view['prompt_ids'])} tokens, more than "
                f"{CONFIG_PATH}.prompt_length={self.prompt_length}"
            )
        keep = self.response_length
        output = AgentLoopOutput(
            prompt_ids=view["prompt_ids"],
            response_ids=view["response_ids"][:keep],
            response_mask=view["response_mask"][:keep],
            response_logprobs=view["response_logprobs"][:keep],
            num_turns=len(node.metadata.get("messages", [])) or 2 * len(node.metadata.get("turns", [])),
            metrics={},
            extra_fields={"turn_scores": [], "tool_rewards": []},
        )
        attach_response_entropy(output, view["rollout_entropy"], keep)
        return output
