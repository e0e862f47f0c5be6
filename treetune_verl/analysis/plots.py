# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The PNG plots of an analysis (matplotlib, Agg backend: no display needed).

- ``histogram.png``: entropy histogram, log count, with the p80 line;
- ``position.png``: mean and p25-p75 band of entropy against relative position in the response;
- ``correctness.png``: entropy distribution of correct vs incorrect responses (density), means in the legend;
- ``top_tokens.png``: the most frequent forking tokens (above p80), count bars labelled with mean entropy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from treetune_verl.analysis.stats import correctness

PLOT_NAMES = ("histogram", "position", "correctness", "top_tokens")


def write_plots(records: Sequence[dict[str, Any]], stats: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write the four plots into ``out_dir``; returns name -> path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entropies = np.concatenate([np.asarray(r["entropies"], dtype=np.float64) for r in records])
    paths = {}
    for name, draw in (
        ("histogram", _histogram),
        ("position", _position),
        ("correctness", _correctness),
        ("top_tokens", _top_tokens),
    ):
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        draw(ax, records, stats, entropies)
        fig.tight_layout()
        paths[name] = out_dir / f"{name}.png"
        fig.savefig(paths[name])
        plt.close(fig)
    return paths


def _histogram(ax, records, stats, entropies) -> None:
    ax.hist(entropies, bins=60, color="#4477aa", log=True)
    ax.axvline(stats["p80"], color="#cc3311", linestyle="--", label=f"p80 = {stats['p80']:.3f} nats")
    ax.set(xlabel="entropy (nats)", ylabel="tokens (log)", title=f"Per-token entropy, {stats['tokens']} tokens")
    ax.legend()


def _position(ax, records, stats, entropies) -> None:
    rows = [r for r in stats["per_position"] if r["tokens"]]
    centers = [(r["start"] + r["end"]) / 2 for r in rows]
    ax.fill_between(centers, [r["p25"] for r in rows], [r["p75"] for r in rows], alpha=0.3, label="p25–p75")
    ax.plot(centers, [r["mean"] for r in rows], marker="o", label="mean")
    ax.set(xlabel="relative position in the response", ylabel="entropy (nats)", xlim=(0, 1))
    ax.set_title("Entropy along the response")
    ax.legend()


def _correctness(ax, records, stats, entropies) -> None:
    groups = {"correct": "#228833", "incorrect": "#cc3311"}
    drawn = False
    bins = np.linspace(0, max(float(entropies.max()), 1e-6), 40)
    for group, colour in groups.items():
        values = [e for r in records if correctness(r.get("score")) == group for e in r["entropies"]]
        if values:
            label = f"{group}: {sum(correctness(r.get('score')) == group for r in records)} responses, mean " + (
                f"{np.mean(values):.3f} nats"
            )
            ax.hist(values, bins=bins, density=True, histtype="step", linewidth=2, color=colour, label=label, log=True)
            drawn = True
    if drawn:
        ax.set(xlabel="entropy (nats)", ylabel="density (log)")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no scored responses", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    ax.set_title("Correct vs incorrect responses")


def _top_tokens(ax, records, stats, entropies) -> None:
    top = stats["top_forking_tokens"][:15][::-1]
    labels = [repr(t["token"]) for t in top]
    bars = ax.barh(labels, [t["count"] for t in top], color="#ee7733")
    for bar, t in zip(bars, top, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" H̄={t['mean_entropy']:.2f}", va="center")
    ax.set(xlabel="count above p80", title=f"Most frequent forking tokens (entropy > {stats['p80']:.3f} nats)")
    ax.margins(x=0.2)
