# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``SequenceNode``: aligned arrays, sentinels, the Atropos and verl views (hand-built values)."""

from __future__ import annotations

import pytest

from treetune_verl.managed.node import SequenceNode, root_node


def two_turn_node() -> SequenceNode:
    root = root_node([5, 6, 7], "p")
    first = root.extended(
        template_ids=[],
        generated_ids=[10, 11],
        generated_logprobs=[-0.5, -1.5],
        generated_entropy=[0.7, 1.2],
        text="a",
        metadata={"finish_reason": "stop"},
    )
    return first.extended(
        template_ids=[8, 9],
        generated_ids=[12],
        generated_logprobs=[-0.25],
        generated_entropy=[2.1],
        text="b",
        metadata={"finish_reason": "length", "parent_id": first.node_id},
    )


def test_views_and_sentinels():
    node = two_turn_node()
    assert node.tokens == [5, 6, 7, 10, 11, 8, 9, 12]
    assert node.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert node.masked_tokens == [-100, -100, -100, 10, 11, -100, -100, 12]
    assert node.logprobs == [1.0, 1.0, 1.0, -0.5, -1.5, 1.0, 1.0, -0.25]
    assert node.entropy == [0.0, 0.0, 0.0, 0.7, 1.2, 0.0, 0.0, 2.1]
    assert node.metadata["turns"] == [(3, 5), (7, 8)] and node.full_text == "pab"
    assert node.to_atropos()["masked_tokens"] == node.masked_tokens
    assert node.to_verl() == {
        "prompt_ids": [5, 6, 7],
        "response_ids": [10, 11, 8, 9, 12],
        "response_mask": [1, 1, 0, 0, 1],
        "response_logprobs": [-0.5, -1.5, 0.0, 0.0, -0.25],
        "rollout_entropy": [0.7, 1.2, 0.0, 0.0, 2.1],
    }


def test_misaligned_arrays_are_refused_naming_the_lengths():
    with pytest.raises(ValueError, match="'entropy': 1"):
        SequenceNode("t", [1, 2], [0, 1], [0.0, -1.0], [0.3])
