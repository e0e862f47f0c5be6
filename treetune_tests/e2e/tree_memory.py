# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Peak memory of a whole process tree (the e2e's ~35 processes: Ray, workers, sglang), sampled every second.

``/usr/bin/time -v`` reports only the largest single process; the e2e figures in the README and
``treetune_specs/2026-11-23-grpo-e2e.md`` are the peak of the PSS (and RSS) summed over the tree:

    bash treetune_tests/e2e/test_entropy_e2e.sh & python -m treetune_tests.e2e.tree_memory $! peak.txt

Writes ``peak_tree_rss_gib=… peak_tree_pss_gib=… procs_at_peak=…`` to the output file after every sample, so the
last line stands when the tree exits.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil


def sample_tree(root: psutil.Process) -> tuple[int, int, int]:
    """``(rss, pss, processes)`` summed over ``root`` and its descendants, in bytes; vanished processes skipped."""
    processes = [root, *root.children(recursive=True)]
    rss = pss = 0
    for process in processes:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss = rss + info.rss, pss + info.pss
    return rss, pss, len(processes)


def main(pid: int, out: Path) -> None:
    root = psutil.Process(pid)
    peak_rss = peak_pss = procs_at_peak = 0
    while root.is_running() and root.status() != psutil.STATUS_ZOMBIE:
        rss, pss, procs = sample_tree(root)
        if pss > peak_pss:
            peak_pss, procs_at_peak = pss, procs
        peak_rss = max(peak_rss, rss)
        out.write_text(
            f"peak_tree_rss_gib={peak_rss / 2**30:.2f} peak_tree_pss_gib={peak_pss / 2**30:.2f} "
            f"procs_at_peak={procs_at_peak}\n"
        )
        time.sleep(1)


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
