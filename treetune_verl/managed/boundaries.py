# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Where one chat turn ends and the next begins, in tokens: the per-family table and the template deltas.

A session never re-tokenizes what the model produced. A new turn appends, after the engine's tokens:

1. the tokens that *close* the model's turn the way the chat template would (:meth:`TurnTemplate.close_turn`): the
   end-of-turn token if the model did not emit it (length / stop-string / abort), then whatever the template
   writes after it (ChatML: ``"\\n"``; Llama-3: nothing);
2. the template tokens of the *new messages only*, up to and including the generation prompt
   (:meth:`TurnTemplate.new_message_ids`): rendered after a fixed anchor conversation that ends with an assistant
   turn, and cut at the anchor's end. Checked token-wise every time, so a template for which this does not hold is
   refused, not silently drifted.

Which token ends a turn and what follows it is per model family: :data:`FAMILIES`, one row per family, each checked
against the tokenizer's own template when a :class:`TurnTemplate` is built and tested with the real tokenizer
(``treetune_tests/treetune_verl/managed/test_boundaries_on_cpu.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TemplateFamily:
    """How a family's chat template ends an assistant turn.

    ``end_of_turn``: the token the model emits to end its turn (an EOS id of its generation config), which the
    template also writes after an assistant message. ``after_end_of_turn``: text the template writes after that token,
    before the next message; the model never generates it. ``marker``: a string of the chat template that identifies
    the family (rows are tried in order).
    """

    name: str
    end_of_turn: str
    after_end_of_turn: str
    marker: str
    note: str = ""


FAMILIES: tuple[TemplateFamily, ...] = (
    TemplateFamily("llama3", "<|eot_id|>", "", "<|start_header_id|>", "the next header follows <|eot_id|> directly"),
    TemplateFamily(
        "smollm2",
        "<|im_end|>",
        "\n",
        "named SmolLM",
        "ChatML; the tokenizer's bos_token is <|im_start|> and plain encoding prepends it; default system prompt",
    ),
    TemplateFamily("chatml", "<|im_end|>", "\n", "<|im_start|>", "Qwen2 / Qwen2.5 / Qwen3 and other ChatML templates"),
)

# A conversation that ends with a closed assistant turn; new messages are rendered after it and cut at its end.
# It has a system message so that templates that insert a default system prompt (SmolLM2, Qwen2.5) do not.
_ANCHOR: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
)


def family_of(tokenizer: Any, name: str | None = None) -> TemplateFamily:
    """The row for ``tokenizer``'s chat template (or the row called ``name``); raises naming the known families."""
    known = [family.name for family in FAMILIES]
    if name is not None:
        for family in FAMILIES:
            if family.name == name:
                return family
        raise ValueError(f"unknown template family {name!r}; known: {known}")
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        raise ValueError("the tokenizer has no chat template (a single string); managed chat sessions need one")
    for family in FAMILIES:
        if family.marker in template:
            return family
    raise ValueError(
        f"no row of treetune_verl.managed.boundaries.FAMILIES matches this chat template (known: {known}); add a row "
        "for its family (end-of-turn token, what the template writes after it) with a test on the real tokenizer"
    )


class TurnTemplate:
    """A tokenizer's chat template as token deltas: first prompt, turn closing, new messages.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        family: a row name of :data:`FAMILIES`; detected from the template when ``None``.
        chat_template_kwargs: passed to every ``apply_chat_template`` call (e.g. ``enable_thinking``).

    Raises:
        ValueError: no row fits, the end-of-turn token is not one token, or the template does not close an
            assistant turn with ``end_of_turn + after_end_of_turn`` as the row says.
    """

    def __init__(self, tokenizer: Any, family: str | None = None, chat_template_kwargs: dict | None = None) -> None:
        self.tokenizer = tokenizer
        self.family = family_of(tokenizer, family)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        eot_ids = self.encode(self.family.end_of_turn)
        if len(eot_ids) != 1:
            raise ValueError(f"{self.family.name}: end-of-turn {self.family.end_of_turn!r} is {eot_ids}, not one token")
        self.end_of_turn_id = eot_ids[0]
        self.after_end_of_turn_ids = self.encode(self.family.after_end_of_turn)
        closing = "A" + self.family.end_of_turn + self.family.after_end_of_turn
        anchor_text = self.render(list(_ANCHOR), add_generation_prompt=False)
        if not anchor_text.endswith(closing):
            raise ValueError(
                f"the chat template does not end an assistant turn with {closing[1:]!r} as the {self.family.name!r} "
                f"row of FAMILIES says (it renders ...{anchor_text[-40:]!r}); pick another family or add a row"
            )

    def render(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.chat_template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any special token added (the template writes its own BOS)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The first prompt of a conversation: all ``messages`` and the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True, tools=tools))

    def close_turn(self, generated_ids: list[int]) -> list[int]:
        """Tokens the template puts after a model turn that the model did not generate itself."""
        ended = bool(generated_ids) and generated_ids[-1] == self.end_of_turn_id
        return ([] if ended else [self.end_of_turn_id]) + self.after_end_of_turn_ids

    def new_message_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Template tokens of ``messages`` following a closed assistant turn, with the generation prompt.

        Raises:
            ValueError: the anchor's tokens are not a prefix of the anchor-plus-messages tokens (the template
                rewrites earlier turns when later ones are added, so no token delta exists).
        """
        anchor = self.encode(self.render(list(_ANCHOR), add_generation_prompt=False, tools=tools))
        full = self.encode(self.render([*_ANCHOR, *messages], add_generation_prompt=True, tools=tools))
        if full[: len(anchor)] != anchor:
            raise ValueError(
                f"{self.family.name}: the chat template changes earlier turns when messages are added "
                f"(roles {[m.get('role') for m in messages]}); their tokens cannot be appended as a delta"
            )
        return full[len(anchor) :]
