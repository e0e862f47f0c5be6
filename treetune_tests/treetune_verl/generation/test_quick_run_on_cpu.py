# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main job of ``make run`` (``python -m treetune_verl.generation.quick_run``) end to end on a real CPU Engine,
its records and heat-map page."""

from __future__ import annotations

import json
import math
import os
import warnings

import pytest

from treetune_tests.treetune_verl.sglang.engine_helpers import hf_token_entropy
from treetune_verl.generation import quick_run
from treetune_verl.generation.heatmap import render_html
from treetune_verl.generation.records import entropy_summary


@pytest.mark.engine
def test_main_job_writes_table_jsonl_and_html(tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is 7 plus 5?\n\nName three colours.\n")
    out_dir = tmp_path / "out"
    records = quick_run.main(
        ["--model", str(tiny_model_dir), "--prompts", str(prompts), "--max-new-tokens", "12", "--top-k", "20"]
        + ["--mode", "tempered", "--temperature", "0.7", "--device", "cpu", "--out-dir", str(out_dir)]
    )
    lines = (out_dir / "responses.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records
    assert [r["prompt"] for r in records] == ["What is 7 plus 5?", "Name three colours."]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for record in records:
        n = len(record["token_ids"])
        assert n == 12 and len(record["entropies"]) == len(record["logprobs"]) == len(record["token_texts"]) == n
        prompt_ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": record["prompt"]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        expected = hf_token_entropy(tiny_model_dir, prompt_ids, record["token_ids"], 20, "tempered", 0.7)
        assert max(abs(a - b) for a, b in zip(record["entropies"], expected, strict=True)) < 1e-4
    page = (out_dir / "entropy.html").read_text()
    assert page.count("<span ") == sum(len(r["token_ids"]) for r in records)


def test_bad_arguments_are_rejected_before_any_work(capsys):
    with pytest.raises(SystemExit):
        quick_run.parse_args(["--top-k", "-1"])
    with pytest.raises(SystemExit):
        quick_run.parse_args(["--mode", "sharpened"])
    assert "--top-k must be >= 0" in capsys.readouterr().err


def test_entropy_summary_and_empty_response():
    s = entropy_summary([0.1 * i for i in range(1, 11)])
    assert s["tokens"] == 10 and s["mean"] == pytest.approx(0.55) and s["p90"] == pytest.approx(0.9)
    assert s["max"] == pytest.approx(1.0)
    empty = entropy_summary([])
    assert empty["tokens"] == 0 and math.isnan(empty["mean"])


def test_html_escapes_token_text_and_shades_by_entropy():
    record = {
        "prompt": "<b>x</b>",
        "token_texts": ["<script>", "ok"],
        "entropies": [0.0, 2.0],
        "logprobs": [-0.1, -2.0],
        "token_ids": [1, 2],
        "finish_reason": {"type": "length"},
    }
    page = render_html([record])
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "rgba(220,40,40,0.000)" in page and "rgba(220,40,40,1.000)" in page
    # the colour legend: white (0) to full colour at the page's scale (the maximum, 2 nats), ticks in nats
    assert page.count("class=legend") == 1 and "rgba(220,40,40,0),rgba(220,40,40,1)" in page
    assert "<span>0.00</span><span>0.50</span><span>1.00</span><span>1.50</span><span>2.00</span>" in page
    assert page.count("<span ") == 2  # the legend adds no token-like spans


def test_quiet_known_notices_filters_only_the_known_notices(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quick_run.quiet_known_notices()
        for module, message in (
            ("sglang.srt.layers.quantization.awq", "Only CUDA, HIP and XPU support AWQ currently."),
            ("treetune_elsewhere", "Only CUDA, HIP and XPU support AWQ currently."),
        ):
            warnings.warn_explicit(message, UserWarning, "x.py", 1, module=module)
    assert [w.filename for w in caught] == ["x.py"] and len(caught) == 1  # only the one from another module shows
    options = os.environ["PYTHONWARNINGS"].split(",")
    assert options[0] == "default" and "ignore:Only CUDA:UserWarning:sglang.srt.layers.quantization.gguf" in options
