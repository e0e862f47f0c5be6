# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``python -m treetune_verl.analysis <generation output dir | responses.jsonl> [--out-dir DIR]``.

Writes ``stats.json``, ``plots/*.png`` and ``report.html`` into ``--out-dir`` (default: ``<output dir>/analysis``,
or ``analysis/`` next to a JSONL) and prints the headline figures.
"""

from __future__ import annotations

import argparse
from typing import Any

from treetune_verl.analysis.pipeline import analyse


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a generation output directory or make run's responses.jsonl")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--examples", type=int, default=6, help="responses shown as heat-maps")
    parser.add_argument("--top", type=int, default=20, help="forking tokens listed")
    args = parser.parse_args(argv)
    try:
        stats = analyse(args.source, args.out_dir, args.examples, args.top)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    top = ", ".join(f"{t['token']!r} ({t['count']})" for t in stats["top_forking_tokens"][:8])
    print(
        f"{stats['responses']} responses, {stats['tokens']} tokens; mean {stats['mean']:.3f} nats, "
        f"p80 {stats['p80']:.3f} nats, {stats['share_below_0.01']:.1%} below 0.01 nats\n"
        f"top forking tokens: {top}"
    )
    return stats


if __name__ == "__main__":
    main()
