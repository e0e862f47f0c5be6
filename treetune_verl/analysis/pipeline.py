# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``analyse``: records -> ``stats.json``, ``plots/*.png`` and ``report.html`` in one output folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from treetune_verl.analysis.load import load_records
from treetune_verl.analysis.plots import write_plots
from treetune_verl.analysis.report_html import pick_examples, render_report
from treetune_verl.analysis.stats import compute_stats


def analyse(source: str | Path, out_dir: str | Path | None = None, examples: int = 6, top: int = 20) -> dict[str, Any]:
    """Stats, plots and report of ``source``; returns the stats (also in ``<out_dir>/stats.json``)."""
    source = Path(source)
    out = Path(out_dir) if out_dir else (source / "analysis" if source.is_dir() else source.parent / "analysis")
    records = load_records(source)
    stats = compute_stats(records, top=top)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    plots = write_plots(records, stats, out / "plots")
    page = render_report(stats, plots, pick_examples(records, examples), f"Per-token entropy — {source}", out)
    (out / "report.html").write_text(page, encoding="utf-8")
    return stats
