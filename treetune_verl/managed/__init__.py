# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Managed sessions: chat-style agent code in, exactly aligned tokens / loss mask / logprobs / entropy out.

``server.ManagedServer`` tracks every call into ``node.SequenceNode`` s, extending by token prefix
(``boundaries``: the per-family turn boundary table and template deltas); ``backends`` (``EngineBackend``: an
in-process sglang Engine, imported lazily; ``VerlBackend``: verl's server manager); ``openai_adapter`` (the
``openai.AsyncOpenAI`` call shape); ``tool_calls`` (Hermes ``<tool_call>`` parsing); ``agent_loop``
(``entropy_managed_agent``). Importing this package does not import sglang.
Spec: ``treetune_specs/2026-11-23-managed-sessions.md``.
"""

from treetune_verl.managed.agent_loop import ManagedAgentLoop, load_agent_fn
from treetune_verl.managed.backends import Backend, EngineBackend, Generation, VerlBackend
from treetune_verl.managed.boundaries import FAMILIES, TemplateFamily, TurnTemplate, family_of
from treetune_verl.managed.node import MASKED_LOGPROB, MASKED_TOKEN_ID, SequenceNode
from treetune_verl.managed.openai_adapter import ManagedOpenAIClient
from treetune_verl.managed.server import ManagedServer
from treetune_verl.managed.tool_calls import parse_hermes_tool_calls

__all__ = [
    "FAMILIES",
    "MASKED_LOGPROB",
    "MASKED_TOKEN_ID",
    "Backend",
    "EngineBackend",
    "Generation",
    "ManagedAgentLoop",
    "ManagedOpenAIClient",
    "ManagedServer",
    "SequenceNode",
    "TemplateFamily",
    "TurnTemplate",
    "VerlBackend",
    "family_of",
    "load_agent_fn",
    "parse_hermes_tool_calls",
]
