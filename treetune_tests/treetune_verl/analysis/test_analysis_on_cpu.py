# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Analysis on synthetic responses with hand-computed answers, and the report opened in headless Chromium."""

from __future__ import annotations

import json

import pytest

from treetune_tests.headless_browser import needs_chromium, probed_dom
from treetune_verl.analysis.__main__ import main
from treetune_verl.analysis.pipeline import analyse
from treetune_verl.analysis.stats import compute_stats
from treetune_verl.generation.shards import ShardWriter

# Ten tokens, sorted: 0, 0, 0.005, 0.1, 0.2, 0.5, 1, 2, 3, 4 (nats).
# Linear quantiles (position q * 9 between order statistics): p50 = 0.2 + 0.5 * (0.5 - 0.2) = 0.35;
# p80 = 2 + 0.2 * (3 - 2) = 2.2; p90 = 3 + 0.1 * (4 - 3) = 3.1. Above p80: 3 ('x') and 4 ('x') -> 'x': 2, mean 3.5.
# Below 0.01 nats: 0, 0, 0.005 -> 3 / 10.
RECORDS = [
    {"prompt": "A", "token_texts": ["a", "x"], "entropies": [0.0, 4.0], "score": 1.0},
    {"prompt": "B", "token_texts": ["b", "c", "x", "d"], "entropies": [0.005, 0.1, 3.0, 0.0], "score": 0.0},
    {"prompt": "C", "token_texts": ["e", "f", "g", "h"], "entropies": [0.2, 0.5, 1.0, 2.0], "score": None},
]
for _r in RECORDS:
    _r.update(logprobs=[-0.5] * len(_r["entropies"]), finish_reason="length")


def test_stats_match_hand_computed_values():
    stats = compute_stats(RECORDS, position_bins=2)
    assert stats["tokens"] == 10 and stats["responses"] == 3
    assert stats["mean"] == pytest.approx(10.805 / 10)
    assert stats["quantiles"]["p50"] == pytest.approx(0.35)
    assert stats["p80"] == stats["quantiles"]["p80"] == pytest.approx(2.2)
    assert stats["quantiles"]["p90"] == pytest.approx(3.1)
    assert stats["share_below_0.01"] == pytest.approx(0.3)
    assert stats["top_forking_tokens"] == [{"token": "x", "count": 2, "mean_entropy": pytest.approx(3.5)}]
    # Relative positions (i + 0.5) / L; first half: A 0; B 0.005, 0.1; C 0.2, 0.5. Second half: the rest.
    first, second = stats["per_position"]
    assert first["tokens"] == 5 and first["mean"] == pytest.approx(0.805 / 5)
    assert second["tokens"] == 5 and second["mean"] == pytest.approx(10.0 / 5)
    groups = stats["per_correctness"]
    assert groups["correct"]["tokens"] == 2 and groups["correct"]["mean"] == pytest.approx(2.0)
    assert groups["incorrect"]["responses"] == 1 and groups["incorrect"]["share_below_0.01"] == pytest.approx(0.5)
    assert groups["unscored"]["p80"] == pytest.approx(1.0 + 0.4 * 1.0)  # of 0.2, 0.5, 1, 2: position 2.4


def test_empty_input_is_refused():
    with pytest.raises(ValueError, match="no tokens"):
        compute_stats([{"prompt": "", "token_texts": [], "entropies": [], "score": None}])


def _generation_dir(path):
    writer = ShardWriter(path, rows_per_shard=2)
    for i, record in enumerate(RECORDS):
        writer.add({"prompt_id": f"p{i}", "sample_index": 0, "prompt": record["prompt"], **record})
    writer.close()
    return path


def test_output_dir_and_jsonl_give_the_same_stats(tmp_path, capsys):
    stats = main([str(_generation_dir(tmp_path / "gen"))])
    assert "10 tokens" in capsys.readouterr().out
    out = tmp_path / "gen" / "analysis"
    assert json.loads((out / "stats.json").read_text()) == json.loads(json.dumps(stats))
    jsonl = tmp_path / "responses.jsonl"  # make run's records: finish_reason a dict, no score
    jsonl.write_text(
        "".join(json.dumps({**r, "finish_reason": {"type": "length"}, "score": None}) + "\n" for r in RECORDS)
    )
    from_jsonl = analyse(jsonl)
    assert from_jsonl["quantiles"] == stats["quantiles"] and list(from_jsonl["per_correctness"]) == ["unscored"]
    with pytest.raises(SystemExit, match="not a generation output directory"):
        main([str(tmp_path)])


@needs_chromium
def test_report_opens_in_headless_chromium_with_every_image(tmp_path):
    """Chromium loads report.html from disk; a script appended to a copy counts the images that decoded
    (naturalWidth > 0) and the heat-map legend, and writes the counts into the DOM that --dump-dom prints."""
    analyse(_generation_dir(tmp_path / "gen"))
    result = probed_dom(
        tmp_path / "gen" / "analysis" / "report.html",
        "images=${document.images.length} loaded=${ok} legends=${document.querySelectorAll('.legend').length} "
        "tokens=${document.querySelectorAll('pre.heat span').length}",
    )
    assert 'data-probe="images=4 loaded=4 legends=1 tokens=10"' in result.stdout, result.stderr[-2000:]
