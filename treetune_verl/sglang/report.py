# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Per-response entropy summaries and their outputs: a console table, JSONL records and an HTML page.

A record is one generated response: ``prompt``, ``token_ids``, ``token_texts``, ``logprobs`` and
``entropies`` (nats; one per generated token, index-aligned), plus ``finish_reason``.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from treetune_verl.sglang.tokenizer_patches import META_INFO_ENTROPY_KEY


def record_from_output(prompt: str, output: dict[str, Any], decode_token: Callable[[int], str]) -> dict[str, Any]:
    """Build a record from one sglang Engine output requested with ``return_logprob=True``."""
    meta = output["meta_info"]
    logprobs = meta["output_token_logprobs"]
    token_ids = [token_id for _, token_id, _ in logprobs]
    return {
        "prompt": prompt,
        "text": output.get("text", ""),
        "finish_reason": meta["finish_reason"],
        "token_ids": token_ids,
        "token_texts": [decode_token(t) for t in token_ids],
        "logprobs": [lp for lp, _, _ in logprobs],
        "entropies": list(meta[META_INFO_ENTROPY_KEY]),
    }


def entropy_summary(entropies: Sequence[float]) -> dict[str, float]:
    """``tokens``, ``mean``, ``p90`` (nearest-rank) and ``max`` of one response's entropies (nats)."""
    if not entropies:
        return {"tokens": 0, "mean": math.nan, "p90": math.nan, "max": math.nan}
    ordered = sorted(entropies)
    p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]
    return {"tokens": len(ordered), "mean": sum(ordered) / len(ordered), "p90": p90, "max": ordered[-1]}


def format_table(records: Sequence[dict[str, Any]], prompt_width: int = 40) -> str:
    """A fixed-width table: one row per response with token count and mean / p90 / max entropy (nats)."""
    header = f"{'#':>3}  {'prompt':<{prompt_width}}  {'tokens':>6}  {'mean':>7}  {'p90':>7}  {'max':>7}  finish"
    lines = [header, "-" * len(header)]
    for i, record in enumerate(records):
        s = entropy_summary(record["entropies"])
        prompt = record["prompt"].replace("\n", " ")
        prompt = prompt if len(prompt) <= prompt_width else prompt[: prompt_width - 1] + "…"
        finish = record["finish_reason"]["type"] if isinstance(record["finish_reason"], dict) else "?"
        lines.append(
            f"{i:>3}  {prompt:<{prompt_width}}  {s['tokens']:>6}  {s['mean']:>7.3f}  {s['p90']:>7.3f}  "
            f"{s['max']:>7.3f}  {finish}"
        )
    return "\n".join(lines)


def write_jsonl(records: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


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
