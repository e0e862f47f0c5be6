# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``report.html``: the plots, the figures, the forking tokens and a few responses as heat-maps, on one page.

The page references the PNGs next to it by relative path, so the folder can be moved or served as is. Heat-maps and
their colour legend are ``make run``'s (``treetune_verl.generation.heatmap``), on one scale: the run's p99 entropy.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treetune_verl.analysis.stats import correctness
from treetune_verl.generation.heatmap import HEATMAP_CSS, entropy_legend, token_heatmap


def pick_examples(records: Sequence[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """Up to ``count`` non-empty responses, alternating correct and incorrect where scores exist (input order)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record["entropies"]:
            groups.setdefault(correctness(record.get("score")), []).append(record)
    picked: list[dict[str, Any]] = []
    queues = [list(g) for g in groups.values()]
    while len(picked) < count and any(queues):
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


def _table(rows: list[tuple[str, str]]) -> str:
    return (
        "<table>"
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )


def render_report(
    stats: dict[str, Any], plots: dict[str, Path], examples: Sequence[dict[str, Any]], title: str, base: Path
) -> str:
    """The page; ``plots`` are referenced relative to ``base`` (the page's folder)."""
    q = stats["quantiles"]
    figures = _table(
        [
            ("responses", str(stats["responses"])),
            ("tokens", str(stats["tokens"])),
            ("mean ± std", f"{stats['mean']:.4f} ± {stats['std']:.4f} nats"),
            ("quantiles", ", ".join(f"{k} {v:.4f}" for k, v in q.items())),
            ("p80 (forking threshold)", f"{stats['p80']:.4f} nats"),
            ("share of tokens below 0.01 nats", f"{stats['share_below_0.01']:.1%}"),
            ("max", f"{stats['max']:.4f} nats"),
        ]
    )
    by_group = "".join(
        f"<tr><td>{html.escape(g)}</td><td>{s['responses']}</td><td>{s['tokens']}</td>"
        + (
            f"<td>{s['mean']:.4f}</td><td>{s['p80']:.4f}</td><td>{s['share_below_0.01']:.1%}</td>"
            if s["tokens"]
            else ""
        )
        + "</tr>"
        for g, s in stats["per_correctness"].items()
    )
    top = "".join(
        f"<tr><td><code>{html.escape(repr(t['token']))}</code></td><td>{t['count']}</td>"
        f"<td>{t['mean_entropy']:.3f}</td></tr>"
        for t in stats["top_forking_tokens"]
    )
    images = "".join(
        f'<figure><img src="{html.escape(str(path.relative_to(base)))}" alt="{name}"></figure>'
        for name, path in plots.items()
    )
    scale = stats["quantiles"]["p99"] or stats["max"] or 1.0
    heatmaps = "".join(
        f"<section><h3>{html.escape(r['prompt'][:200])}</h3><p class=meta>{len(r['entropies'])} tokens · "
        f"{correctness(r.get('score'))} · finish {html.escape(str(r['finish_reason']))}</p>"
        f"{token_heatmap(r, scale)}</section>"
        for r in examples
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;max-width:72em;margin:auto;padding:0 1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}figure{display:inline-block;margin:.5em}"
        f"img{{max-width:34em}}{HEATMAP_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<h2>Figures</h2>{figures}<h2>Plots</h2>{images}"
        "<h2>By correctness</h2><table><tr><th>group</th><th>responses</th><th>tokens</th><th>mean</th><th>p80</th>"
        f"<th>&lt; 0.01 nats</th></tr>{by_group}</table>"
        "<h2>Most frequent forking tokens (entropy above p80)</h2><table><tr><th>token</th><th>count</th>"
        f"<th>mean entropy (nats)</th></tr>{top}</table>"
        f"<h2>Responses</h2><p>Each token shaded by its entropy (hover for values); scale 0 to the run's p99, "
        f"{scale:.3f} nats.</p>{entropy_legend(scale)}{heatmaps}</body></html>"
    )
