# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Prompt sets: a verl-format parquet or a JSONL file, checked row by row before anything is generated.

verl parquet (what verl's ``RLHFDataset`` reads): ``prompt`` a chat (a list of ``{"role", "content"}`` messages),
``data_source``, and optionally ``reward_model.ground_truth``. JSONL: one object per line with ``prompt`` (a string,
taken as one user message, or a chat), optionally ``id``, ``data_source`` and ``ground_truth`` (or
``reward_model.ground_truth``). A bad row raises :class:`InputError` naming the file, the row and the field, never
an error from deep inside the tokenizer or sglang.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """A prompt file that cannot be used; the message names the file, the row (0-based) and the field."""


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str  # unique within the set; with the sample index it identifies a response in the output
    messages: tuple[dict[str, str], ...]  # the chat, ending with the turn the model answers
    data_source: str
    ground_truth: str | None  # the reference answer for the rule-based check, if any

    @property
    def display_prompt(self) -> str:
        """The last user message (what a report shows as "the prompt")."""
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return users[-1] if users else self.messages[-1]["content"]


def _chat(value: Any, where: str, allow_string: bool) -> tuple[dict[str, str], ...]:
    if allow_string and isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if hasattr(value, "tolist") and not isinstance(value, str):  # numpy arrays from pandas-written parquet
        value = value.tolist()
    if not isinstance(value, list | tuple):
        expected = "a string or a chat" if allow_string else "a chat"
        raise InputError(
            f"{where}: 'prompt' must be {expected} (a list of {{'role', 'content'}} messages), "
            f"got {type(value).__name__}: {str(value)[:80]!r}"
        )
    if not value:
        raise InputError(f"{where}: 'prompt' is empty (no messages)")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InputError(f"{where}: 'prompt'[{i}] is not a chat message with a string 'role': {message!r:.80}")
        if not isinstance(message.get("content"), str):
            raise InputError(f"{where}: 'prompt'[{i}] ('{message['role']}') has no string 'content'")
        messages.append({"role": message["role"], "content": message["content"]})
    if not any(m["content"].strip() for m in messages):
        raise InputError(f"{where}: 'prompt' is empty (every message's content is blank)")
    return tuple(messages)


def _ground_truth(row: Mapping[str, Any]) -> str | None:
    value = row.get("ground_truth")
    reward_model = row.get("reward_model")
    if value is None and isinstance(reward_model, Mapping):
        value = reward_model.get("ground_truth")
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value if isinstance(value, str) else json.dumps(value)


def _unique(items: list[PromptItem], path: Path) -> list[PromptItem]:
    seen: dict[str, int] = {}
    for row, item in enumerate(items):
        if item.prompt_id in seen:
            raise InputError(f"{path} row {row}: id {item.prompt_id!r} repeats row {seen[item.prompt_id]}")
        seen[item.prompt_id] = row
    if not items:
        raise InputError(f"{path}: no prompts")
    return items


def load_parquet(path: Path) -> list[PromptItem]:
    """Rows of a verl-format parquet; ``prompt_id`` is the row number (as text)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [c for c in ("prompt", "data_source") if c not in table.column_names]
    if missing:
        raise InputError(f"{path}: missing column(s) {missing}; a verl parquet has {['prompt', 'data_source']}")
    items = []
    for row, record in enumerate(table.to_pylist()):
        where = f"{path} row {row}"
        if not isinstance(record["data_source"], str):
            raise InputError(f"{where}: 'data_source' must be a string, got {record['data_source']!r}")
        items.append(
            PromptItem(str(row), _chat(record["prompt"], where, False), record["data_source"], _ground_truth(record))
        )
    return _unique(items, path)


def load_jsonl(path: Path) -> list[PromptItem]:
    """One JSON object per non-empty line; ``prompt_id`` is ``id`` if given, else the row number."""
    items = []
    lines: Iterable[str] = path.read_text(encoding="utf-8").splitlines()
    row = 0
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path} row {row} (line {line_number})"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or "prompt" not in record:
            raise InputError(f"{where}: expected an object with a 'prompt' field")
        prompt_id = str(record.get("id", row))
        data_source = record.get("data_source", "jsonl")
        items.append(
            PromptItem(prompt_id, _chat(record["prompt"], where, True), str(data_source), _ground_truth(record))
        )
        row += 1
    return _unique(items, path)


def load_prompt_file(path: str | Path) -> list[PromptItem]:
    """A ``.parquet`` or ``.jsonl`` prompt set (chosen by suffix)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if path.suffix == ".parquet":
        return load_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        return load_jsonl(path)
    raise InputError(f"{path}: expected a .parquet (verl format) or .jsonl file")
