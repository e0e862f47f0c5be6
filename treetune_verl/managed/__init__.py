# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Managed sessions: chat-style agent code in, exactly aligned tokens / loss mask / logprobs / entropy out.

``server.ManagedServer`` tracks every call into ``node.SequenceNode`` s, extending by token prefix
(``boundaries``: the per-family turn boundary table and template deltas); ``backends`` (``EngineBackend``: an
in-process sglang Engine, imported lazily; ``VerlBackend``: verl's server manager); ``openai_adapter`` (the
``openai.AsyncOpenAI`` call shape); ``tool_calls`` (Hermes ``<tool_call>`` parsing); ``scored`` (what an
agent hands back: nodes with its own reward); ``environment`` (``Environment``: task, episode, score); ``agent_loop``
(``entropy_managed_agent``, verl's agent loop). Importing this package imports neither sglang nor verl: the names
below are imported on first use.
Spec: ``treetune_specs/2026-11-23-managed-sessions.md``.
"""

from treetune_verl.lazy_exports import lazy_exports

_WHERE = {
    "ManagedAgentLoop": "treetune_verl.managed.agent_loop",
    "load_agent_fn": "treetune_verl.managed.agent_loop",
    "Backend": "treetune_verl.managed.backends",
    "EngineBackend": "treetune_verl.managed.backends",
    "Generation": "treetune_verl.managed.backends",
    "VerlBackend": "treetune_verl.managed.backends",
    "FAMILIES": "treetune_verl.managed.boundaries",
    "TemplateFamily": "treetune_verl.managed.boundaries",
    "TurnTemplate": "treetune_verl.managed.boundaries",
    "family_of": "treetune_verl.managed.boundaries",
    "Environment": "treetune_verl.managed.environment",
    "MASKED_LOGPROB": "treetune_verl.managed.node",
    "MASKED_TOKEN_ID": "treetune_verl.managed.node",
    "SequenceNode": "treetune_verl.managed.node",
    "ManagedOpenAIClient": "treetune_verl.managed.openai_adapter",
    "ScoredNode": "treetune_verl.managed.scored",
    "ManagedServer": "treetune_verl.managed.server",
    "parse_hermes_tool_calls": "treetune_verl.managed.tool_calls",
}
__getattr__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "FAMILIES",
    "MASKED_LOGPROB",
    "MASKED_TOKEN_ID",
    "Backend",
    "EngineBackend",
    "Environment",
    "Generation",
    "ManagedAgentLoop",
    "ManagedOpenAIClient",
    "ManagedServer",
    "ScoredNode",
    "SequenceNode",
    "TemplateFamily",
    "TurnTemplate",
    "VerlBackend",
    "family_of",
    "load_agent_fn",
    "parse_hermes_tool_calls",
]
