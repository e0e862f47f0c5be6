# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``ManagedServer``: chat-style agent code in, sequences with exactly aligned tokens / masks / logprobs / entropy out.

    async with ManagedServer(EngineBackend(engine)) as managed:
        reply = await managed.chat_completion(messages, n=2, max_tokens=64)
        messages += [reply.choices[0].message, {"role": "user", "content": "And then?"}]
        await managed.chat_completion(messages)              # extends the first choice's node
        nodes = managed.get_state()["nodes"]                 # 2 nodes: [extended first choice, second choice]

Tracking, per call:

- **Extension** is detected on the message list: a call whose messages start with a tracked node's conversation (its
  prompt messages plus the assistant reply it produced) extends that node (the longest such node wins). The new
  sequence is the node's tokens, the tokens that close the model's turn and the template tokens of the *new*
  messages only (:class:`~treetune_verl.managed.boundaries.TurnTemplate`), then the new model turn. Nothing the model
  produced is ever re-tokenized. ``completion(prompt)`` extends a node whose ``full_text`` the prompt starts with,
  appending the tokens of the rest of the prompt.
- **A call that extends no node starts a new node** (a fresh prompt from the chat template / the prompt text).
- **Default mode** keeps one node per trajectory: an extension replaces the node it extends (with ``n > 1`` the
  other choices follow it in the list). **Tree mode** (``track_tree=True``) keeps every node, with its parent:
  ``get_state()`` returns ``{"sequences": {node_id: node}, "tree": {node_id: parent_id}}``.

Refused, with the lengths / the reason: a prompt that leaves no room in the backend's context (``max_tokens`` larger
than the room left is lowered to it, as verl's server does), a backend without token ids / logprobs / entropy.

All requests of a session carry one rid prefix (``backend.open_session()``); leaving the ``async with`` block with
an exception, or with a call still running, aborts the whole session in the engine.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.managed import responses
from treetune_verl.managed.backends import Generation, check_backend
from treetune_verl.managed.boundaries import TurnTemplate
from treetune_verl.managed.messages import as_dict, for_template, message_key
from treetune_verl.managed.node import SequenceNode, root_node
from treetune_verl.managed.tool_calls import parse_hermes_tool_calls

CHAT, COMPLETION = "chat", "completion"


class ManagedServer:
    """Tracks every call of a session into :class:`~treetune_verl.managed.node.SequenceNode` s.

    Args:
        backend: an ``EngineBackend`` or ``VerlBackend`` (anything returning token ids, logprobs and entropy).
        tokenizer: the model's tokenizer; for an ``EngineBackend`` the Engine's own when ``None``.
        track_tree: keep every node with its parent (default: one node per trajectory).
        family: a row of :data:`~treetune_verl.managed.boundaries.FAMILIES` (detected from the template if ``None``).
        chat_template_kwargs: passed to every ``apply_chat_template`` call.

    Raises:
        TypeError: the backend cannot return token ids, logprobs and entropy.
        ValueError: no tokenizer.
    """

    def __init__(
        self,
        backend: Any,
        tokenizer: Any = None,
        track_tree: bool = False,
        family: str | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> None:
        check_backend(backend)
        self.backend = backend
        if tokenizer is None:
            tokenizer = getattr(getattr(getattr(backend, "engine", None), "tokenizer_manager", None), "tokenizer", None)
        if tokenizer is None:
            raise ValueError("ManagedServer needs the model's tokenizer (pass tokenizer=...)")
        self.tokenizer = tokenizer
        self.track_tree = track_tree
        self._family = family
        self._chat_template_kwargs = chat_template_kwargs
        self._template: TurnTemplate | None = None  # built on the first chat call (completion() needs no template)
        self.session = backend.open_session()
        self._nodes: list[SequenceNode] = []  # default mode
        self._sequences: dict[int, SequenceNode] = {}  # tree mode
        self._in_flight = 0
        self.last_nodes: list[SequenceNode] = []  # the nodes of the last call, one per choice

    async def __aenter__(self) -> ManagedServer:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if (exc_type is not None or self._in_flight) and self.session is not None:
            await self.backend.abort(self.session)

    @property
    def template(self) -> TurnTemplate:
        if self._template is None:
            self._template = TurnTemplate(self.tokenizer, self._family, self._chat_template_kwargs)
        return self._template

    @property
    def last_node(self) -> SequenceNode | None:
        """The first choice's node of the last call (what an agent loop trains on unless told otherwise)."""
        return self.last_nodes[0] if self.last_nodes else None

    def get_state(self) -> dict[str, Any]:
        if self.track_tree:
            return {
                "sequences": dict(self._sequences),
                "tree": {node_id: node.metadata["parent_id"] for node_id, node in self._sequences.items()},
            }
        return {"nodes": list(self._nodes)}

    def leaves(self) -> list[SequenceNode]:
        """The session's trajectories: the tracked nodes no other tracked node extends (default mode: every node)."""
        nodes = self._tracked()
        if not self.track_tree:
            return nodes
        parents = {node.metadata.get("parent_id") for node in nodes}
        return [node for node in nodes if node.node_id not in parents]

    def node_for(self, messages: list[Any]) -> SequenceNode:
        """The chat node a conversation ends on: the tracked one with the longest conversation ``messages`` start
        with (tool results after its reply are in no node: the model never read them).

        Raises:
            ValueError: no call of this session produced a conversation that ``messages`` start with.
        """
        node = self._chat_parent([message_key(as_dict(message)) for message in messages])
        if node is None:
            raise ValueError(
                f"no call of this session produced a conversation that these {len(messages)} messages start with"
            )
        return node

    def reset(self) -> None:
        self._nodes.clear()
        self._sequences.clear()
        self.last_nodes = []

    def _tracked(self) -> list[SequenceNode]:
        return list(self._sequences.values()) if self.track_tree else list(self._nodes)

    async def chat_completion(
        self,
        messages: list[Any],
        n: int = 1,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        stop: str | list[str] | None = None,
        tools: list[dict] | None = None,
        parse_tool_calls: bool | None = None,
    ) -> Any:
        """An OpenAI-shaped ``ChatCompletion`` (``choices[i].message.content`` / ``.tool_calls``, ``.finish_reason``).

        ``tools`` go to the chat template of a new conversation; tool calls in the reply (Hermes ``<tool_call>``
        JSON) are parsed into ``message.tool_calls`` when ``tools`` are given (or ``parse_tool_calls=True``).
        """
        messages = [as_dict(message) for message in messages]
        keys = [message_key(message) for message in messages]
        parent = self._chat_parent(keys)
        if parent is None:
            base = self._root(self.template.prompt_ids([for_template(m) for m in messages], tools))
            template_ids: list[int] = []
        else:
            start, end = parent.metadata["turns"][-1]
            new = [for_template(m) for m in messages[len(parent.metadata["messages"]) :]]
            template_ids = self.template.close_turn(parent.tokens[start:end]) + self.template.new_message_ids(
                new, tools
            )
            base = parent
        generations = await self._generate(base.tokens + template_ids, n, max_tokens, temperature, top_p, top_k, stop)
        parse = bool(tools) if parse_tool_calls is None else parse_tool_calls
        replies, reasons, nodes = [], [], []
        for generation in generations:
            text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
            reply: dict[str, Any] = {"role": "assistant", "content": text}
            reason = generation.finish_reason
            metadata: dict[str, Any] = {"finish_reason": reason}
            if parse:
                parsed = parse_hermes_tool_calls(text)
                reply["content"] = parsed.content
                if parsed.tool_calls:
                    reply["tool_calls"] = parsed.tool_calls
                    reason = "tool_calls" if reason == "stop" else reason
                if parsed.errors:
                    metadata["tool_call_errors"] = parsed.errors
            metadata["messages"] = [*messages, reply]
            metadata["message_keys"] = [*keys, message_key(reply)]
            nodes.append(self._extend(base, template_ids, generation, parent, CHAT, metadata))
            replies.append(reply)
            reasons.append(reason)
        self._track(parent, nodes)
        return responses.chat_completion(
            replies, reasons, len(base.tokens) + len(template_ids), _generated(generations)
        )

    async def completion(
        self,
        prompt: str,
        n: int = 1,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        stop: str | list[str] | None = None,
    ) -> Any:
        """An OpenAI-shaped ``Completion`` (``choices[i].text``, ``.finish_reason``) of a plain-text prompt.

        A prompt that starts with a tracked completion node's ``full_text`` extends it: only the rest of the prompt
        is tokenized and appended (earlier model turns keep their logprobs and entropy).
        """
        parent = max(
            (
                node
                for node in self._tracked()
                if node.metadata.get("kind") == COMPLETION and prompt.startswith(node.full_text)
            ),
            key=lambda node: len(node.full_text),
            default=None,
        )
        if parent is None:
            base, template_ids, suffix = self._root(self._encode_prompt(prompt), prompt), [], ""
        else:
            suffix = prompt[len(parent.full_text) :]
            base = parent
            template_ids = list(self.tokenizer.encode(suffix, add_special_tokens=False)) if suffix else []
        generations = await self._generate(base.tokens + template_ids, n, max_tokens, temperature, top_p, top_k, stop)
        texts = [self.tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]
        nodes = [
            self._extend(
                base, template_ids, g, parent, COMPLETION, {"finish_reason": g.finish_reason}, text=suffix + text
            )
            for g, text in zip(generations, texts, strict=True)
        ]
        self._track(parent, nodes)
        reasons = [g.finish_reason for g in generations]
        return responses.text_completion(texts, reasons, len(base.tokens) + len(template_ids), _generated(generations))

    def _chat_parent(self, keys: list[str]) -> SequenceNode | None:
        """The tracked chat node with the longest conversation that ``keys`` start with."""
        best = None
        for node in self._tracked():
            conversation = node.metadata.get("message_keys")
            if node.metadata.get("kind") != CHAT or conversation is None or len(conversation) > len(keys):
                continue
            if keys[: len(conversation)] == conversation and (best is None or len(conversation) > len(best[1])):
                best = (node, conversation)
        return best[0] if best else None

    def _root(self, prompt_ids: list[int], text: str | None = None) -> SequenceNode:
        if text is None:
            text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return root_node(prompt_ids, text)

    def _encode_prompt(self, prompt: str) -> list[int]:
        """A plain prompt's ids: the tokenizer's special tokens added, unless the text already starts with its BOS
        (SmolLM2's tokenizer prepends ``<|im_start|>`` as BOS: a rendered chat prompt would get it twice)."""
        bos = getattr(self.tokenizer, "bos_token", None)
        add_special = not (bos and prompt.startswith(bos))
        return list(self.tokenizer.encode(prompt, add_special_tokens=add_special))

    def _extend(
        self,
        base: SequenceNode,
        template_ids: list[int],
        generation: Generation,
        parent: SequenceNode | None,
        kind: str,
        metadata: dict[str, Any],
        text: str | None = None,
    ) -> SequenceNode:
        if text is None:  # chat: the exact text of the sequence, special tokens included
            text = self.tokenizer.decode(template_ids + generation.token_ids, skip_special_tokens=False)
        metadata = {
            **metadata,
            "kind": kind,
            "parent_id": parent.node_id if parent is not None else None,
            "session": self.session,
        }
        return base.extended(
            template_ids=template_ids,
            generated_ids=generation.token_ids,
            generated_logprobs=generation.logprobs,
            generated_entropy=generation.entropy,
            text=text,
            metadata=metadata,
        )

    def _track(self, parent: SequenceNode | None, nodes: list[SequenceNode]) -> None:
        self.last_nodes = nodes
        if self.track_tree:
            self._sequences.update({node.node_id: node for node in nodes})
        elif parent is not None and any(node is parent for node in self._nodes):
            i = next(i for i, node in enumerate(self._nodes) if node is parent)
            self._nodes[i : i + 1] = nodes
        else:
            self._nodes.extend(nodes)

    async def _generate(
        self,
        prompt_ids: list[int],
        n: int,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        top_k: int | None,
        stop: str | list[str] | None,
    ) -> list[Generation]:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        room = self.backend.context_length - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room to generate in the backend's context of "
                f"{self.backend.context_length} tokens"
            )
        params: dict[str, Any] = {"max_new_tokens": room if max_tokens is None else min(max_tokens, room)}
        for key, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k), ("stop", stop)):
            if value is not None:
                params[key] = value
        self._in_flight += 1
        try:
            generations = await self.backend.generate(prompt_ids, params, n, self.session)
        finally:
            self._in_flight -= 1
        if len(generations) != n:
            raise RuntimeError(f"backend returned {len(generations)} continuations for n={n}")
        return generations


def _generated(generations: list[Generation]) -> int:
    return sum(len(g.token_ids) for g in generations)
