# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The per-token entropy heat-map in HTML: each token shaded by its entropy, a colour legend, and ``make run``'s
self-contained page (the analysis report reuses the CSS, legend and token heat-map).

Reads the records of :mod:`treetune_verl.generation.records`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from treetune_verl.generation.records import entropy_summary

HEATMAP_RGB = (220, 40, 40)  # a token's background: this colour at alpha = entropy / scale
HEATMAP_CSS = (
    "pre.heat{white-space:pre-wrap;font-size:1.05em;line-height:1.6}.meta{color:#555}"
    ".legend{display:flex;align-items:center;gap:.5em;margin:.5em 0 1em}"
    ".legend .bar{display:block;width:16em;height:1em;border:1px solid #999}"
    ".legend .ticks{display:flex;justify-content:space-between;width:16em;font-size:.8em;color:#333}"
)


def entropy_legend(scale: float) -> str:
    """The colour legend of :func:`token_heatmap`: a bar from white (0 nats) to full colour (``scale`` nats).
    Uses no ``<span `` (a page's token spans stay countable)."""
    r, g, b = HEATMAP_RGB
    ticks = "".join(f"<span>{scale * f:.2f}</span>" for f in (0.0, 0.25, 0.5, 0.75, 1.0))
    return (
        '<div class=legend role=img aria-label="entropy colour scale">'
        "<b>entropy (nats)</b><div>"
        f'<i class=bar style="background:linear-gradient(to right,rgba({r},{g},{b},0),rgba({r},{g},{b},1))"></i>'
        f"<div class=ticks>{ticks}</div></div></div>"
    )


def token_heatmap(record: dict[str, Any], scale: float) -> str:
    """One response as a ``<pre>`` of tokens, each shaded by its entropy (alpha = min(1, entropy / scale)), with
    its entropy and logprob in the tooltip."""
    r, g, b = HEATMAP_RGB
    spans = []
    for text, entropy, logprob in zip(record["token_texts"], record["entropies"], record["logprobs"], strict=True):
        alpha = min(1.0, max(0.0, entropy / scale)) if scale > 0 else 0.0
        tip = f"H={entropy:.4f} nats, logprob={logprob:.4f}"
        spans.append(
            f'<span style="background: rgba({r},{g},{b},{alpha:.3f})" title="{tip}">{html.escape(text or "")}</span>'
        )
    return f"<pre class=heat>{''.join(spans)}</pre>"


def render_html(records: Sequence[dict[str, Any]], title: str = "Per-token sampling entropy") -> str:
    """A self-contained page: each token shaded by its entropy (white = 0, red = the run's maximum), with a legend."""
    scale = max((e for r in records for e in r["entropies"]), default=0.0) or 1.0
    blocks = []
    for i, record in enumerate(records):
        s = entropy_summary(record["entropies"])
        blocks.append(
            f"<section><h3>#{i}: {html.escape(record['prompt'])}</h3>"
            f"<p class=meta>{s['tokens']} tokens · mean {s['mean']:.3f} · p90 {s['p90']:.3f} · max {s['max']:.3f} "
            f"nats</p>{token_heatmap(record, scale)}</section>"
        )
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:60em;margin:auto}}"
        f"{HEATMAP_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>Shading: entropy of the sampling distribution at each token, "
        f"0 to {scale:.3f} nats (the run's maximum). Hover a token for its values.</p>"
        + entropy_legend(scale)
        + "".join(blocks)
        + "</body></html>"
    )
