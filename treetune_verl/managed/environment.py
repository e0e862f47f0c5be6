# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``Environment``: an RL environment on verl's agent loop, in the spirit of Atropos' ``BaseEnv``.

A user subclasses it and writes three methods; verl's dataset, rollout and trainer do the rest::

    class Arithmetic(Environment):
        def task(self, row):                      # the dataset row -> what an episode needs
            return row["raw_prompt"], row["extra_info"]["answer"]

        async def episode(self, client, task):    # turns through the OpenAI-shaped client
            messages = list(task[0])
            reply = await client.chat.completions.create(model="policy", messages=messages)
            return messages + [reply.choices[0].message]

        def score(self, task, messages):          # one trajectory's reward
            return float(str(task[1]) in (messages[-1].content or ""))

and selects it with ``+actor_rollout_ref.rollout.custom.managed.environment=package.module:Arithmetic`` (the loop
``entropy_managed_agent``, README "Write an environment"). Each sample runs one episode in one managed session;
``episode`` returns the conversation it ended with, or several (the branches of an ``n > 1`` call, each continued):
each is a training row, scored by ``score``. The row of a conversation is the session's node it ends on
(:meth:`ManagedServer.node_for`): exactly the tokens the model read and wrote, with their log-probs and entropy.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.managed.openai_adapter import ManagedOpenAIClient
from treetune_verl.managed.scored import ScoredNode
from treetune_verl.managed.server import ManagedServer

Conversation = list[Any]  # chat messages: dicts or the message objects the client returned


class Environment:
    """Subclass and override :meth:`episode` and :meth:`score` (and :meth:`task` to shape the dataset row)."""

    def task(self, row: dict[str, Any]) -> Any:
        """What an episode needs, from the dataset row (its fields; ``raw_prompt`` is the chat prompt)."""
        return row

    async def episode(self, client: ManagedOpenAIClient, task: Any) -> Conversation | list[Conversation]:
        """Run the episode through ``client``; the conversation it ended with, or one per branch."""
        raise NotImplementedError(f"{type(self).__name__} must define async episode(client, task)")

    def score(self, task: Any, messages: Conversation) -> float | tuple[float, dict[str, float]] | None:
        """One trajectory's reward (and named extras); ``None`` leaves it to verl's reward function."""
        raise NotImplementedError(f"{type(self).__name__} must define score(task, messages)")

    async def __call__(self, managed: ManagedServer, messages: list[Any], **row: Any) -> list[ScoredNode]:
        """The agent-function contract of ``entropy_managed_agent``: one episode, its scored rows."""
        task = self.task({"raw_prompt": messages, **row})
        returned = await self.episode(ManagedOpenAIClient(managed), task)
        branches = returned if returned and isinstance(returned[0], (list, tuple)) else [returned]
        rows = []
        for conversation in branches:
            scored = self.score(task, conversation)
            score, extras = scored if isinstance(scored, tuple) else (scored, {})
            rows.append(ScoredNode(managed.node_for(conversation), score, extras))
        return rows
