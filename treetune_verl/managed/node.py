# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``SequenceNode``: one tracked sequence, every array aligned token for token, and its Atropos and verl views.

Shape notation: ``L`` = ``len(tokens)``, the whole sequence (prompt, model turns, template and tool tokens).

    tokens         [L] int    every token id, as the engine saw / returned them
    loss_mask      [L] int    1 where the model generated the token, 0 elsewhere
    masked_tokens  [L] int    tokens, with -100 where loss_mask is 0            (Atropos' convention)
    logprobs       [L] float  sampled-token log-probability (nats); 1.0 where loss_mask is 0 (Atropos' sentinel)
    entropy        [L] float  entropy (nats) of the distribution the token was sampled from; 0.0 where loss_mask is 0

Example (``p`` prompt, ``m`` model, ``t`` template/tool)::

    tokens         p    p    m      m      t    t
    loss_mask      0    0    1      1      0    0
    masked_tokens  -100 -100 m      m      -100 -100
    logprobs       1.0  1.0  -0.31  -2.05  1.0  1.0
    entropy        0.0  0.0  1.12   2.40   0.0  0.0
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

MASKED_TOKEN_ID = -100  # masked_tokens where the model did not generate (Atropos, HF's ignore_index)
MASKED_LOGPROB = 1.0  # logprobs there: an impossible log-probability, so "masked" cannot pass for a value
MASKED_ENTROPY = 0.0  # entropy there (verl's rollout_entropy convention)

_node_ids = itertools.count()


@dataclass
class SequenceNode:
    """One sequence a session produced: prompt, model turns and the template tokens between them.

    ``metadata`` holds ``finish_reason`` (of the last model turn), ``turns`` (one ``(start, end)`` token span per
    model turn, end exclusive), ``prompt_length`` (tokens before the first model token), ``node_id``,
    ``parent_id`` (the node this one extends; tree mode) and ``messages`` (the conversation the node ends with).
    """

    full_text: str
    tokens: list[int]
    loss_mask: list[int]
    logprobs_generated: list[float] = field(repr=False)  # [L], 0.0 where loss_mask is 0 (internal; see logprobs)
    entropy: list[float]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lengths = {
            "tokens": len(self.tokens),
            "loss_mask": len(self.loss_mask),
            "logprobs": len(self.logprobs_generated),
            "entropy": len(self.entropy),
        }
        if len(set(lengths.values())) != 1:
            raise ValueError(f"SequenceNode arrays must have one length, got {lengths}")
        self.metadata.setdefault("node_id", next(_node_ids))

    @property
    def node_id(self) -> int:
        return self.metadata["node_id"]

    @property
    def masked_tokens(self) -> list[int]:
        """[L]: ``tokens`` with -100 where the model did not generate the token."""
        return [t if m else MASKED_TOKEN_ID for t, m in zip(self.tokens, self.loss_mask, strict=True)]

    @property
    def logprobs(self) -> list[float]:
        """[L]: sampled-token log-probabilities (nats), 1.0 where the model did not generate the token."""
        return [lp if m else MASKED_LOGPROB for lp, m in zip(self.logprobs_generated, self.loss_mask, strict=True)]

    @property
    def prompt_length(self) -> int:
        """Tokens before the first model turn (the whole sequence when there is none yet)."""
        turns = self.metadata.get("turns") or []
        return turns[0][0] if turns else len(self.tokens)

    def to_atropos(self) -> dict[str, Any]:
        """The seed's ``SequenceNode`` fields: ``full_text``, ``tokens``, ``masked_tokens``, ``logprobs``, ``metadata``."""
        return {
            "full_text": self.full_text,
            "tokens": list(self.tokens),
            "masked_tokens": self.masked_tokens,
            "logprobs": self.logprobs,
            "metadata": dict(self.metadata),
        }

    def to_verl(self) -> dict[str, list]:
        """verl's split: ``prompt_ids`` up to the first model token, the rest as the response.

        ``response_mask`` 1 at model tokens; ``response_logprobs`` and ``rollout_entropy`` 0.0 at the others (verl's
        tool loop convention), all ``len(response_ids)`` long.
        """
        start = self.prompt_length
        return {
            "prompt_ids": self.tokens[:start],
            "response_ids": self.tokens[start:],
            "response_mask": self.loss_mask[start:],
            "response_logprobs": self.logprobs_generated[start:],
            "rollout_entropy": self.entropy[start:],
        }

    def extended(
        self,
        *,
        template_ids: list[int],
        generated_ids: list[int],
        generated_logprobs: list[float],
        generated_entropy: list[float],
        text: str,
        metadata: dict[str, Any],
    ) -> SequenceNode:
        """A new node: this one's arrays, then ``template_ids`` (masked), then a model turn (trained on).

        ``metadata`` replaces this node's (``turns`` is carried on; the caller sets ``parent_id``)."""
        start = len(self.tokens) + len(template_ids)
        turns = [*self.metadata.get("turns", []), (start, start + len(generated_ids))]
        return SequenceNode(
            full_text=self.full_text + text,
            tokens=self.tokens + template_ids + generated_ids,
            loss_mask=self.loss_mask + [0] * len(template_ids) + [1] * len(generated_ids),
            logprobs_generated=self.logprobs_generated + [0.0] * len(template_ids) + list(generated_logprobs),
            entropy=self.entropy + [MASKED_ENTROPY] * len(template_ids) + list(generated_entropy),
            metadata={**metadata, "turns": turns},
        )


def root_node(prompt_ids: list[int], prompt_text: str) -> SequenceNode:
    """A node holding only a prompt (nothing generated); the start of every new sequence."""
    n = len(prompt_ids)
    return SequenceNode(
        full_text=prompt_text,
        tokens=list(prompt_ids),
        loss_mask=[0] * n,
        logprobs_generated=[0.0] * n,
        entropy=[MASKED_ENTROPY] * n,
        metadata={"turns": [], "parent_id": None},
    )
