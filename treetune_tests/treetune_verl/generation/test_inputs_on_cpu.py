# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Prompt files, the built-in set, the answer check, configuration refusals and the shard writer (no Engine)."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from treetune_verl.generation.config import resolve_config
from treetune_verl.generation.inputs import InputError, load_prompt_file
from treetune_verl.generation.scoring import builtin_score, final_answer
from treetune_verl.generation.shards import ShardWriter, check_run_file, completed_keys, read_responses, shard_paths
from treetune_verl.generation.word_problems import word_problem_items


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _verl_row(content, truth="3"):
    return {
        "data_source": "d",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": truth},
    }


def test_verl_parquet_rows_become_items(tmp_path):
    items = load_prompt_file(_parquet(tmp_path / "p.parquet", [_verl_row("1+2?"), _verl_row("2+2?", "4")]))
    assert [(i.prompt_id, i.display_prompt, i.ground_truth) for i in items] == [("0", "1+2?", "3"), ("1", "2+2?", "4")]


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"data_source": "d", "question": "x"}], "missing column(s) ['prompt']"),
        ([_verl_row("ok"), _verl_row("   ")], "row 1: 'prompt' is empty"),
        ([_verl_row("ok"), {**_verl_row("x"), "prompt": []}], "row 1: 'prompt' is empty (no messages)"),
        ([{"data_source": "d", "prompt": "plain text"}], "row 0: 'prompt' must be a chat"),
        ([{"data_source": "d", "prompt": ["plain", "text"]}], "row 0: 'prompt'[0] is not a chat message"),
    ],
)
def test_bad_parquet_names_the_row(tmp_path, rows, message):
    with pytest.raises(InputError, match=re.escape(message)):
        load_prompt_file(_parquet(tmp_path / "bad.parquet", rows))


def test_jsonl_prompts_strings_and_chats(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [{"prompt": "Hi", "id": "a", "ground_truth": 7}, {"prompt": [{"role": "user", "content": "Yo"}]}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    items = load_prompt_file(path)
    assert [(i.prompt_id, i.messages, i.ground_truth) for i in items] == [
        ("a", ({"role": "user", "content": "Hi"},), "7"),
        ("1", ({"role": "user", "content": "Yo"},), None),
    ]
    path.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": {"role": "user"}}) + "\n")
    with pytest.raises(InputError, match=r"row 1 \(line 2\): 'prompt' must be a string or a chat"):
        load_prompt_file(path)
    path.write_text(json.dumps({"prompt": "a", "id": 1}) + "\n" + json.dumps({"prompt": "b", "id": 1}) + "\n")
    with pytest.raises(InputError, match="row 1: id '1' repeats row 0"):
        load_prompt_file(path)


def test_builtin_word_problems_are_deterministic_and_checkable():
    items = word_problem_items(200, seed=0)
    assert items == word_problem_items(200, seed=0) and items != word_problem_items(200, seed=1)
    assert len({i.prompt_id for i in items}) == 200 and all(int(i.ground_truth) >= 0 for i in items)
    assert builtin_score(f"so the answer is\n#### {items[0].ground_truth}", items[0].ground_truth) == 1.0


@pytest.mark.parametrize(
    "response, answer, score",
    [
        ("12 + 7 = 19. #### 19", "19", 1.0),
        ("#### 1,200.", "1200", 1.0),
        ("I think 5, no, 6", "6", 1.0),
        ("I think 6, no, 5", "6", 0.0),
        ("no idea", "6", 0.0),
        ("#### 19 because 20 - 1", "19", 1.0),
    ],
)
def test_answer_check(response, answer, score):
    assert builtin_score(response, answer) == score


def test_final_answer_without_a_number():
    assert final_answer("nothing here") is None


@pytest.mark.parametrize(
    "override, message",
    [
        ({"sampling": {"n": 0}}, "sampling.n must be a positive integer"),
        ({"entropy": {"mode": "sharp"}}, "entropy.mode must be one of"),
        ({"sampling": {"top_p": 0}}, r"sampling.top_p must be in \(0, 1\]"),
        ({"score": {"function": "llm"}}, "score.function must be one of"),
        ({"sampling": {"nn": 1}}, "invalid generation config"),
        ({"entropy": {"mode": "tempered"}, "sampling": {"temperature": 0}}, "entropy.mode=tempered needs"),
        ({"backend": "vllm"}, "backend must be one of"),
        ({"verl": {"batch_size": 0}}, "verl.batch_size must be a positive integer"),
        ({"verl": {"num_workers": -1}}, "verl.num_workers must be a positive integer"),
        ({"verl": {"ray_address": 5}}, "verl.ray_address must be null"),
    ],
)
def test_config_refusals_name_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        resolve_config(override)


def _row(prompt_id, sample_index):
    return {"prompt_id": prompt_id, "sample_index": sample_index, "token_ids": [1], "entropies": [0.5]}


def test_shards_are_atomic_and_numbering_resumes(tmp_path):
    writer = ShardWriter(tmp_path, rows_per_shard=2)
    for key in [("a", 0), ("a", 1), ("b", 0)]:
        writer.add(_row(*key))
    assert len(shard_paths(tmp_path)) == 1 and completed_keys(tmp_path) == {("a", 0), ("a", 1)}  # ("b", 0) buffered
    (tmp_path / "shards" / "shard-00001.parquet.tmp").write_bytes(b"half a shard")  # a run killed mid-write
    writer = ShardWriter(tmp_path, rows_per_shard=2)
    assert not list((tmp_path / "shards").glob("*.tmp")) and writer.next_index == 1
    writer.add(_row("b", 0))
    writer.close()
    assert [p.name for p in shard_paths(tmp_path)] == ["shard-00000.parquet", "shard-00001.parquet"]
    assert read_responses(tmp_path)["prompt_id"].to_pylist() == ["a", "a", "b"]


def test_resume_with_other_settings_is_refused(tmp_path):
    check_run_file(tmp_path, {"model": "m", "sampling": {"n": 2}})
    check_run_file(tmp_path, {"model": "m", "sampling": {"n": 2}})
    with pytest.raises(ValueError, match=r"different settings \(sampling: .*'n': 2.*'n': 3"):
        check_run_file(tmp_path, {"model": "m", "sampling": {"n": 3}})
