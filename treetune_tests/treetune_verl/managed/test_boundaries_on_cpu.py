# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""One test per row of ``boundaries.FAMILIES`` with a real tokenizer, and the thinking that a template drops.

For each family the token assembly a session makes (first prompt, the model's reply ending in its end-of-turn token,
``close_turn``, ``new_message_ids``) must equal the tokenizer's own ``apply_chat_template`` of the whole conversation,
where the template is deterministic (contents without surrounding whitespace). Tokenizers: SmolLM2's (packaged) and
the tiny Qwen2's ChatML one, both real. No Llama-3 tokenizer can be downloaded here, so the Llama-3 row is checked on
SmolLM2's BPE with Llama-3's special tokens added and Meta-Llama-3-8B-Instruct's published chat template (below).
"""

from __future__ import annotations

import pytest

from treetune_verl.managed.boundaries import FAMILIES, TurnTemplate, family_of

# Meta-Llama-3-8B-Instruct's tokenizer_config.json chat_template, verbatim.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# A ChatML template that drops <think>...</think> from earlier assistant turns, as Qwen3's does.
THINK_STRIPPING_TEMPLATE = (
    "{% for message in messages %}{% set content = message['content'] %}{% if message['role'] == 'assistant' and "
    "'</think>' in content %}{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a fruit."},
    {"role": "assistant", "content": "Apple."},
    {"role": "user", "content": "Another one?"},
]


@pytest.fixture(scope="module")
def tokenizers(smollm2_dir, tiny_model_dir):
    from transformers import AutoTokenizer

    llama3 = AutoTokenizer.from_pretrained(str(smollm2_dir))
    llama3.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        }
    )
    llama3.chat_template = LLAMA3_TEMPLATE
    return {
        "smollm2": AutoTokenizer.from_pretrained(str(smollm2_dir)),
        "chatml": AutoTokenizer.from_pretrained(str(tiny_model_dir)),
        "llama3": llama3,
    }


def _with_template(tokenizer, chat_template: str):
    copy = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    copy.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    copy.chat_template = chat_template
    return copy


def assembled(template: TurnTemplate, conversation: list[dict], reply_ids: list[int]) -> list[int]:
    """A session's tokens for ``conversation`` whose assistant turn (index 2) the model answered with ``reply_ids``."""
    prompt = template.prompt_ids(conversation[:2])
    return prompt + reply_ids + template.close_turn(reply_ids) + template.new_message_ids(conversation[3:])


@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
@pytest.mark.parametrize("stopped", ["end_of_turn", "length"])
def test_family_row_matches_the_real_template(tokenizers, name, stopped):
    tokenizer = tokenizers[name]
    template = TurnTemplate(tokenizer)
    assert template.family.name == name
    reply = template.encode("Apple.") + ([template.end_of_turn_id] if stopped == "end_of_turn" else [])
    ours = assembled(template, CONVERSATION, reply)
    reference = list(
        tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    assert tokenizer.decode(ours) == tokenizer.decode(reference)
    # the template's own tokens after the reply (closing + new messages) are exactly the reference's
    tail = ours[len(template.prompt_ids(CONVERSATION[:2])) + len(reply) :]
    assert reference[-len(tail) :] == tail
    if name != "llama3":
        # whole-sequence token equality; on the stand-in Llama-3 tokenizer SmolLM2's BPE merges the header's "\n\n"
        # with the reply's first word when the whole text is re-tokenized (a real model never sees that merge)
        assert ours == reference, (tokenizer.decode(ours), tokenizer.decode(reference))
    assert ours.count(template.end_of_turn_id) == reference.count(template.end_of_turn_id)
    assert ours[1] != ours[0], "doubled BOS"


def test_wrong_row_is_refused(tokenizers):
    with pytest.raises(ValueError, match=r"end-of-turn '<\|eot_id\|>' is \[.*\], not one token"):
        TurnTemplate(tokenizers["chatml"], family="llama3")
    with pytest.raises(ValueError, match=r"does not end an assistant turn with '<\|eot_id\|>'"):
        TurnTemplate(_with_template(tokenizers["llama3"], THINK_STRIPPING_TEMPLATE), family="llama3")
    assert family_of(tokenizers["llama3"]).name == "llama3"


def test_negative_control_a_wrong_boundary_is_caught(tokenizers):
    """Dropping the newline ChatML writes after <|im_end|> (the Llama-3 rule on a ChatML template) breaks equality."""
    template = TurnTemplate(tokenizers["chatml"])
    reply = template.encode("Apple.") + [template.end_of_turn_id]
    wrong = template.prompt_ids(CONVERSATION[:2]) + reply + template.new_message_ids(CONVERSATION[3:])
    reference = list(tokenizers["chatml"].apply_chat_template(CONVERSATION, add_generation_prompt=True))
    assert wrong != reference


def test_thinking_is_kept_when_the_template_drops_it(tokenizers):
    """Re-rendering the history loses the model's <think> tokens; the token-prefix assembly keeps them."""
    tokenizer = tokenizers["smollm2"]
    tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = THINK_STRIPPING_TEMPLATE
    template = TurnTemplate(tokenizer, family="chatml")
    produced = "<think>\nfruit, red\n</think>\nApple."
    reply = template.encode(produced) + [template.end_of_turn_id]
    conversation = [*CONVERSATION[:2], {"role": "assistant", "content": produced}, CONVERSATION[3]]
    ours = assembled(template, conversation, reply)
    rerendered = list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False))
    assert "fruit, red" in tokenizer.decode(ours)
    assert "fruit, red" not in tokenizer.decode(rerendered)  # the template dropped it
    start = len(template.prompt_ids(conversation[:2]))
    assert ours[start : start + len(reply)] == reply
