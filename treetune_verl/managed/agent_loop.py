# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy_managed_agent``: a verl agent loop that hands a :class:`ManagedServer` to a user's agent or environment.

What runs the session is named by an import path, ``"package.module:name"`` (or ``package.module.name``):

- ``actor_rollout_ref.rollout.custom.managed.environment``: an
  :class:`~treetune_verl.managed.environment.Environment` subclass (instantiated once per sample), or
- ``actor_rollout_ref.rollout.custom.managed.agent_fn`` (or the ``agent_fn`` key of the loop's entry in an
  ``agent_loop_config_path`` YAML): an async agent function.

The agent function is called as ``await agent_fn(managed, messages, **sample)`` with ``messages`` the dataset row's
``raw_prompt`` and ``sample`` the row's other fields (``extra_info``, ``tools_kwargs``, ``index``, ``uid``, ...), and
returns what to train on (:mod:`~treetune_verl.managed.scored`): ``None`` for the first choice of its last call, a
:class:`SequenceNode`, a :class:`ScoredNode` (with the agent's own reward) or a list of them (the session's
branches: one row each, ``rollout.custom.managed.rows_per_session`` of them; ``verl/v0_7_1/session_rows_worker.py``).

Each row becomes an ``AgentLoopOutput``: ``prompt_ids`` up to its first model turn, the rest as the response
(``response_mask`` 1 at model tokens, ``response_logprobs`` and ``extra_fields["response_entropy"]`` the served
values there and 0.0 elsewhere), truncated to ``response_length`` as verl's loops truncate. An agent's score goes to
``reward_score`` and its extras to ``extra_fields["reward_extra_info"]``: verl's worker then skips its reward
function for the row and puts the score at the row's last response token of ``rm_scores``. The worker puts the
entropy into ``batch["rollout_entropy"]`` exactly as for the other entropy loops. On verl 0.9.1 each row also carries
``extra_fields["min_global_steps"]`` / ``["max_global_steps"]``, the weight versions of its session's turns (over the
whole session), which the V1 trainer tags rows with.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from treetune_verl.agent_loop.recorder import attach_response_entropy
from treetune_verl.batch_keys import MANAGED_ROW_KEY
from treetune_verl.managed.backends import VerlBackend
from treetune_verl.managed.environment import Environment
from treetune_verl.managed.scored import ScoredNode, scored_rows
from treetune_verl.managed.server import ManagedServer
from treetune_verl.rollout.rollout_config import CONFIG_PATH, MANAGED_SECTION, managed_section

AgentFn = Callable[..., Awaitable[Any]]
AGENT_FN_KEY = f"{CONFIG_PATH}.custom.{MANAGED_SECTION}.agent_fn"
ENVIRONMENT_KEY = f"{CONFIG_PATH}.custom.{MANAGED_SECTION}.environment"


def load_agent_fn(path: str) -> Any:
    """The object at ``"module:name"`` or ``"module.name"``; raises naming the path."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path 'package.module:name'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{path!r} cannot be imported: {error}") from error
    if not callable(fn):
        raise ValueError(f"{path!r} is not callable")
    return fn


def _agent(agent_fn: str | None, rollout_config: Any) -> AgentFn:
    """The session's runner: an instance of the configured environment, or the agent function."""
    section = managed_section(rollout_config)
    environment = section.get("environment")
    path = agent_fn or section.get("agent_fn")
    if environment and path:
        raise ValueError(f"set one of {ENVIRONMENT_KEY} and {AGENT_FN_KEY}, not both")
    if environment:
        cls = load_agent_fn(environment)
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise ValueError(f"{ENVIRONMENT_KEY}={environment!r} is not a treetune_verl.managed.Environment subclass")
        return cls()
    if not path:
        raise ValueError(
            f"entropy_managed_agent needs an environment or an agent function: set +{ENVIRONMENT_KEY}="
            f"package.module:Class, +{AGENT_FN_KEY}=package.module:function or the agent_fn key of its "
            "agent_loop_config_path entry"
        )
    return load_agent_fn(path)


@register("entropy_managed_agent")
class ManagedAgentLoop(AgentLoopBase):
    """Runs one managed session per sample; see the module docstring for the agent's contract."""

    # Read by the agent-loop worker (verl/v0_7_1/session_rows_worker.py): this loop may return a session's k rows.
    returns_session_rows = True

    def __init__(self, *args: Any, agent_fn: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_fn = _agent(agent_fn, self.rollout_config)
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length
        max_model_len = self.rollout_config.get("max_model_len")
        self.context_length = int(max_model_len or self.prompt_length + self.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """One output per row the agent returned (a list when it returned several)."""
        messages = list(kwargs.pop("raw_prompt"))
        name = getattr(self.agent_fn, "__qualname__", type(self.agent_fn).__qualname__)
        where = f"agent {name}, uid {kwargs.get('uid')!r}, index {kwargs.get('index')!r}"
        backend = VerlBackend(self.server_manager, self.context_length, default_sampling=sampling_params)
        async with ManagedServer(
            backend, tokenizer=self.tokenizer, chat_template_kwargs=self.apply_chat_template_kwargs
        ) as managed:
            returned = await self.agent_fn(managed, messages, **kwargs)
        rows = scored_rows(returned, managed.last_node, where)  # the session has ended: nothing left to abort
        branches = len(managed.leaves())
        outputs = [self.to_output(row, rows=len(rows), branches=branches) for row in rows]
        if backend.weight_versions:  # verl 0.9.1: the V1 trainer tags each row with them (staleness control)
            oldest, newest = min(backend.weight_versions), max(backend.weight_versions)
            for output in outputs:
                output.extra_fields.update(min_global_steps=oldest, max_global_steps=newest)
        return outputs[0] if len(outputs) == 1 else outputs

    def to_output(self, row: ScoredNode, rows: int = 1, branches: int = 1) -> AgentLoopOutput:
        """``row`` as verl's ``AgentLoopOutput`` (response truncated to ``response_length``); ``rows`` and
        ``branches`` of its session go to the step's metrics."""
        node = row.node
        view = node.to_verl()
        if len(view["prompt_ids"]) > self.prompt_length:
            raise ValueError(
                f"the managed session's first prompt has {len(view['prompt_ids'])} tokens, more than "
                f"{CONFIG_PATH}.prompt_length={self.prompt_length}"
            )
        keep = self.response_length
        messages = node.metadata.get("messages", [])
        extra_fields: dict[str, Any] = {
            "turn_scores": [],
            "tool_rewards": [],
            MANAGED_ROW_KEY: {
                "rows": rows,
                "branches": branches,
                "turns": len(node.metadata.get("turns", [])),
                "tool_calls": sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant"),
                "agent_score": row.score,
            },
        }
        if row.score is not None:
            extra_fields["reward_extra_info"] = dict(row.extras)
        output = AgentLoopOutput(
            prompt_ids=view["prompt_ids"],
            response_ids=view["response_ids"][:keep],
            response_mask=view["response_mask"][:keep],
            response_logprobs=view["response_logprobs"][:keep],
            reward_score=None if row.score is None else float(row.score),
            num_turns=len(messages) or 2 * len(node.metadata.get("turns", [])),
            metrics={},
            extra_fields=extra_fields,
        )
        attach_response_entropy(output, view["rollout_entropy"], keep)
        return output
