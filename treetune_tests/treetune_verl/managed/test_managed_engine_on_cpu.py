# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Managed sessions on the real CPU sglang Engine (patched by ``install()``) with the real SmolLM2 and its tokenizer.

One Engine for the module. References are independent: a teacher-forced HF forward of each node's full token
sequence, ``torch.log_softmax`` in float64 written here, for both the logprob of every model token and the entropy
(nats) of the distribution it was sampled from (raw mode, temperature 1).
"""

from __future__ import annotations

import pytest
import torch

from treetune_tests.treetune_verl.sglang.engine_helpers import entropy_engine
from treetune_verl.managed import MASKED_LOGPROB, MASKED_TOKEN_ID, EngineBackend, ManagedServer

pytestmark = pytest.mark.engine
ATOL = 1e-4
SYSTEM = {"role": "system", "content": "You are a concise assistant."}
EOT, IM_START, NEWLINE = 2, 1, 198  # SmolLM2: <|im_end|>, <|im_start|> (also its tokenizer's BOS), "\n"


class RecordingBackend(EngineBackend):
    """The real EngineBackend, keeping each continuation the Engine returned (to compare with the nodes)."""

    def __init__(self, engine):
        super().__init__(engine)
        self.returned: list[tuple[list[int], list[int]]] = []  # (prompt_ids, generated ids)

    async def _one(self, prompt_ids, sampling_params, session):
        generation = await super()._one(prompt_ids, sampling_params, session)
        self.returned.append((list(prompt_ids), list(generation.token_ids)))
        return generation


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    with entropy_engine(smollm2_dir) as engine:
        yield engine


@pytest.fixture(scope="module")
def hf(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm2_dir), torch_dtype=torch.float32).eval()


@torch.no_grad()
def hf_logprobs_entropy(hf, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[L] each: log p(tokens[i] | tokens[:i]) and the entropy at position i (nats); position 0 is NaN."""
    logits = hf(input_ids=torch.tensor([tokens])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1)  # [L-1, V], predicts tokens[1:]
    token_logp = logp.gather(-1, torch.tensor(tokens[1:]).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    nan = torch.tensor([float("nan")], dtype=torch.float64)
    return torch.cat([nan, token_logp]), torch.cat([nan, entropy])


def run(engine, coro):
    return engine.loop.run_until_complete(coro)


def test_three_turn_chat_n2_aligned_with_hf(engine, hf):
    backend = RecordingBackend(engine)
    questions = ["Name a fruit.", "Why that one?", "Say it in one word."]

    async def agent():
        async with ManagedServer(backend) as managed:
            messages = [SYSTEM, {"role": "user", "content": questions[0]}]
            first = await managed.chat_completion(messages, n=2, max_tokens=16, temperature=1.0)
            for choice in first.choices:  # each choice continued for two more turns
                history = [*messages, choice.message]
                for question in questions[1:]:
                    history.append({"role": "user", "content": question})
                    reply = await managed.chat_completion(history, max_tokens=16, temperature=1.0)
                    history.append(reply.choices[0].message)
            return managed.get_state()["nodes"], first

    nodes, first = run(engine, agent())
    assert len(nodes) == 2 and len(backend.returned) == 6
    returned: dict[tuple[int, ...], list[list[int]]] = {}  # prompt -> the continuations returned for it
    for prompt, ids in backend.returned:
        returned.setdefault(tuple(prompt), []).append(ids)
    worst_logprob = worst_entropy = 0.0
    for node, choice in zip(nodes, first.choices, strict=True):
        n = len(node.tokens)
        assert len(node.loss_mask) == len(node.logprobs) == len(node.entropy) == len(node.masked_tokens) == n
        turns = node.metadata["turns"]
        assert len(turns) == 3
        # every generated span is what the Engine returned for exactly the tokens before it
        for start, end in turns:
            assert node.tokens[start:end] in returned[tuple(node.tokens[:start])]
        mask = torch.tensor(node.loss_mask, dtype=torch.bool)
        assert mask.tolist() == [any(s <= i < e for s, e in turns) for i in range(n)]
        # sentinels where the model did not generate
        assert all(t == MASKED_TOKEN_ID for t, m in zip(node.masked_tokens, node.loss_mask, strict=True) if not m)
        assert all(lp == MASKED_LOGPROB for lp, m in zip(node.logprobs, node.loss_mask, strict=True) if not m)
        assert all(h == 0.0 for h, m in zip(node.entropy, node.loss_mask, strict=True) if not m)
        # no doubled BOS, exactly one <|im_end|> closing each model turn before the next <|im_start|>
        assert node.tokens[0] == IM_START and node.tokens[1] != IM_START
        for (_, end), (next_start, _) in zip(turns[:-1], turns[1:], strict=True):
            k = node.tokens.index(IM_START, end - 1)
            assert node.tokens[k - 2 : k] == [EOT, NEWLINE] and node.tokens[k - 3] != EOT, node.tokens[end - 3 : k + 1]
            assert node.tokens[end:next_start].count(IM_START) == 2  # the user turn, then the assistant header
        # logprobs and entropy against the HF forward of the node's full sequence
        hf_logp, hf_entropy = hf_logprobs_entropy(hf, node.tokens)
        ours_logp = torch.tensor(node.logprobs, dtype=torch.float64)
        ours_entropy = torch.tensor(node.entropy, dtype=torch.float64)
        logprob_error = (ours_logp[mask] - hf_logp[mask]).abs().max().item()
        entropy_error = (ours_entropy[mask] - hf_entropy[mask]).abs().max().item()
        assert logprob_error <= ATOL and entropy_error <= ATOL, (logprob_error, entropy_error)
        # negative control: the same values one position late fail by far
        late = (ours_entropy.roll(1)[mask] - hf_entropy[mask]).abs().max().item()
        assert late > 100 * ATOL
        worst_logprob, worst_entropy = max(worst_logprob, logprob_error), max(worst_entropy, entropy_error)
        assert node.metadata["messages"][2]["content"] == choice.message.content
        assert node.full_text == engine.tokenizer_manager.tokenizer.decode(node.tokens)
    assert nodes[0].tokens[: turns[0][0]] == nodes[1].tokens[: turns[0][0]]  # both choices share the first prompt
    assert sorted(returned[tuple(nodes[0].tokens[: turns[0][0]])]) == sorted(
        [node.tokens[slice(*node.metadata["turns"][0])] for node in nodes]
    )
    print(f"max |logprob - HF| {worst_logprob:.2e}, max |entropy - HF| {worst_entropy:.2e} nats")


def atropos_text_prefix_tokens(tokenizer, node_tokens, full_text, next_messages) -> list[int]:
    """The seed's extension (the reason this design exists), written here as the reference of the drift: the next
    prompt is rendered as text; if it starts with the node's ``full_text`` (prompt text + reply content), only the
    rest of the text is tokenized and appended to the node's tokens."""
    prompt_text = tokenizer.apply_chat_template(next_messages, add_generation_prompt=True, tokenize=False)
    assert prompt_text.startswith(full_text)
    return node_tokens + tokenizer.encode(prompt_text[len(full_text) :], add_special_tokens=False)


def test_text_prefix_retokenization_would_drift(engine):
    """Same tokenizer, same two-turn conversation, greedy: the text-prefix design duplicates <|im_end|>; ours does not."""
    tokenizer = engine.tokenizer_manager.tokenizer
    messages = [SYSTEM, {"role": "user", "content": "What is 3 plus 4?"}]

    async def agent():
        async with ManagedServer(EngineBackend(engine)) as managed:
            reply = await managed.chat_completion(messages, max_tokens=32, temperature=0.0)
            first = managed.last_node
            follow_up = [*messages, reply.choices[0].message, {"role": "user", "content": "And 5 plus 6?"}]
            await managed.chat_completion(follow_up, max_tokens=1, temperature=0.0)
            return first, reply, follow_up, managed.last_node

    first, reply, follow_up, second = run(engine, agent())
    assert first.metadata["finish_reason"] == "stop" and first.tokens[-1] == EOT  # the model closed its turn
    start = second.metadata["turns"][1][0]
    ours = second.tokens[:start]
    prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    theirs = atropos_text_prefix_tokens(
        tokenizer, first.tokens, prompt_text + reply.choices[0].message.content, follow_up
    )
    assert ours != theirs
    assert len(theirs) == len(ours) + 1
    end = first.metadata["turns"][0][1]
    assert theirs[end - 1 : end + 1] == [EOT, EOT] and ours[end - 1 : end + 1] == [EOT, NEWLINE]
    print(f"two-turn prompt: ours {len(ours)} tokens, text-prefix {len(theirs)} (one duplicated <|im_end|>)")


def test_tree_mode_branching_at_turn_two(engine):
    async def agent():
        async with ManagedServer(EngineBackend(engine), track_tree=True) as managed:
            messages = [SYSTEM, {"role": "user", "content": "Name a color."}]
            reply = await managed.chat_completion(messages, max_tokens=12, temperature=1.0)
            root = managed.last_node
            branch = [*messages, reply.choices[0].message, {"role": "user", "content": "Another?"}]
            await managed.chat_completion(branch, n=2, max_tokens=12, temperature=1.0)
            return root, managed.last_nodes, managed.get_state()

    root, children, state = run(engine, agent())
    assert set(state["sequences"]) == {root.node_id, *(c.node_id for c in children)}
    assert state["tree"][root.node_id] is None
    for child in children:
        assert state["tree"][child.node_id] == root.node_id == child.metadata["parent_id"]
        assert child.tokens[: len(root.tokens)] == root.tokens  # the parent's tokens are the child's prefix
        assert child.entropy[: len(root.tokens)] == root.entropy and child.logprobs[: len(root.tokens)] == root.logprobs
    start = children[0].metadata["turns"][1][0]
    assert children[0].tokens[:start] == children[1].tokens[:start]  # siblings share the prefix up to their turn
    assert children[0].metadata["turns"][1][0] == children[1].metadata["turns"][1][0]


def test_default_mode_new_conversation_starts_a_node_and_errors_leave_nothing(engine):
    """A call that extends nothing starts a new node; an exception inside the block aborts the session."""

    async def agent():
        async with ManagedServer(EngineBackend(engine)) as managed:
            await managed.chat_completion([SYSTEM, {"role": "user", "content": "Hi."}], max_tokens=4)
            await managed.chat_completion([SYSTEM, {"role": "user", "content": "Bye."}], max_tokens=4)
            nodes = managed.get_state()["nodes"]
            managed.reset()
            return nodes, managed.get_state()["nodes"]

    nodes, after_reset = run(engine, agent())
    assert len(nodes) == 2 and nodes[0].metadata["parent_id"] is None and after_reset == []
    with pytest.raises(ValueError, match=r"prompt of \d+ tokens leaves no room .* context of \d+ tokens"):
        run(engine, ManagedServer(EngineBackend(engine)).completion("word " * 10000))
    from treetune_tests.treetune_verl.sglang.engine_helpers import entropy_state_in_scheduler

    assert entropy_state_in_scheduler(engine) == 0


def test_completion_extension_keeps_earlier_logprobs(engine, smollm2_tokenizer):
    """completion(): an extending prompt appends only its new text; the first turn keeps its logprobs/entropy."""

    async def agent():
        async with ManagedServer(EngineBackend(engine)) as managed:
            first = await managed.completion("The capital of France is", max_tokens=6, temperature=1.0)
            node = managed.last_node
            prompt = "The capital of France is" + first.choices[0].text + "\nThe capital of Spain is"
            await managed.completion(prompt, max_tokens=6, temperature=1.0)
            return node, managed.get_state()["nodes"]

    node, nodes = run(engine, agent())
    [extended] = nodes
    assert extended.tokens[: len(node.tokens)] == node.tokens
    assert extended.logprobs[: len(node.tokens)] == node.logprobs and len(extended.metadata["turns"]) == 2
    # the prompt as transformers' own tokenizer encodes it (special tokens included: SmolLM2's GGUF tokenizer adds
    # <|im_start|> as BOS under transformers 4, none under transformers 5), BOS never doubled
    prompt_ids = smollm2_tokenizer("The capital of France is")["input_ids"]
    assert extended.tokens[: len(prompt_ids)] == prompt_ids and extended.tokens[:2] != [IM_START, IM_START]
