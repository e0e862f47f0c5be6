# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The README's example environment: shown there in full, under 40 lines, and its tool and reward as documented.

(It trains in ``e2e/test_e2e_managed_on_cpu.py``.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from treetune_tests.e2e.script import REPO_ROOT
from treetune_verl.examples import calculator
from treetune_verl.examples.calculator import Calculator, calculate


def _user_code() -> str:
    """The module from its first import on (what a user writes; the license header and docstring left out)."""
    text = Path(calculator.__file__).read_text()
    return text[text.index("import json") :]


def test_the_readme_shows_the_example_in_full_under_40_lines():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("### Write an environment", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == _user_code()
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) < 40, f"{len(lines)} lines of user code"
    assert f"is {len(lines)} lines" in section.split("```python", 1)[0]


def test_the_calculator_tool_answers_and_reports_bad_calls():
    assert calculate('{"a": 17, "op": "*", "b": 3}') == "51"
    assert calculate('{"a": 17, "op": "-", "b": "20"}') == "-3"
    for bad in ('{"a": 1, "op": "/", "b": 2}', "not json", '{"a": "x", "op": "+", "b": 2}'):
        assert calculate(bad).startswith("error: ")


@pytest.mark.parametrize(
    ("content", "reward", "solved"),
    [
        ("17 + 25 is 42. #### 42", 1.0, 1.0),
        ("#### 45", 0.5 / 4, 0.0),  # 3 off
        ("no number here", 0.0, 0.0),
        (None, 0.0, 0.0),  # a reply that was only a tool call
    ],
)
def test_the_reward_is_exact_match_with_partial_credit(content, reward, solved):
    env = Calculator()
    task = env.task(
        {"raw_prompt": [{"role": "user", "content": "What is 17 + 25?"}], "reward_model": {"ground_truth": "42"}}
    )
    messages = [*task[0], SimpleNamespace(role="assistant", content=content, tool_calls=None)]
    assert env.score(task, messages) == (pytest.approx(reward), {"solved": solved})


def test_an_episode_ending_on_a_tool_result_scores_zero():
    env = Calculator()
    task = ([{"role": "user", "content": "What is 2 + 2?"}], 4)
    messages = [*task[0], SimpleNamespace(role="assistant", content="4", tool_calls=[object()])]
    messages.append({"role": "tool", "tool_call_id": "call_0", "content": "4"})
    assert env.score(task, messages) == (0.0, {"solved": 0.0})
