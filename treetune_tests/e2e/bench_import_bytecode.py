# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What the bytecode written by ``tools/cpu_env/setup.sh`` saves each process that imports sglang or verl.

    python -m treetune_tests.e2e.bench_import_bytecode --pairs 6 --out treetune_specs/figures/import_bytecode_<date>.json

Two arms, one fresh interpreter per import, ``PYTHONDONTWRITEBYTECODE=1`` in both (as on this machine and CI's):
``bytecode`` reads the environment's ``__pycache__`` (what setup's ``compileall`` wrote); ``source`` sets
``PYTHONPYCACHEPREFIX`` to an empty folder, where Python then looks for bytecode instead, so it compiles every source it
imports, as every process did before setup wrote the bytecode. Per module, pairs in ABBA order; the figure
is the median over pairs of source / bytecode CPU seconds (user + system of the child), with a distribution-free 95 %
interval. Run it alone on the machine. An upper bound of setup's saving: the ``source`` arm compiles torch's sources
too, which pip's install had already given bytecode before setup wrote the rest (a plain import then took 12.6 and
11.1 CPU-s without setup's bytecode, 7.5 and 6.2 with: single ``/usr/bin/time`` reads, 2026-11-29).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95

# What every Ray worker, sglang server, scheduler and detokenizer process of a run imports.
MODULES = ("sglang.srt.entrypoints.engine", "verl.trainer.ppo.ray_trainer")
ARMS = ("bytecode", "source")


def import_cpu_seconds(module: str, arm: str, empty_prefix: str) -> float:
    """CPU seconds (user + system) of a fresh interpreter that imports ``module`` in ``arm``."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if arm == "source":
        env["PYTHONPYCACHEPREFIX"] = empty_prefix
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    for module in MODULES:  # the bytecode arm must have bytecode to read
        top = importlib.util.find_spec(module.split(".")[0]).origin
        if not os.path.exists(importlib.util.cache_from_source(top)):
            raise SystemExit(f"no bytecode for {top}: run make setup (tools/cpu_env/setup.sh writes it)")

    seconds: dict[str, dict[str, list[float]]] = {m: {a: [] for a in ARMS} for m in MODULES}
    with tempfile.TemporaryDirectory() as empty_prefix:
        for pair in range(args.pairs):
            order = ARMS if pair % 2 == 0 else ARMS[::-1]  # ABBA
            for module in MODULES:
                for arm in order:
                    seconds[module][arm].append(import_cpu_seconds(module, arm, empty_prefix))
            print(
                f"pair {pair + 1}/{args.pairs}: "
                + ", ".join(
                    f"{m} {seconds[m]['source'][-1]:.1f} / {seconds[m]['bytecode'][-1]:.1f} CPU-s" for m in MODULES
                ),
                flush=True,
            )

    result = {"pairs": args.pairs, "python": sys.version.split()[0], "date": time.strftime("%F"), "modules": {}}
    for module in MODULES:
        ratios = [s / b for s, b in zip(seconds[module]["source"], seconds[module]["bytecode"], strict=True)]
        low, high = median_ci95(ratios)
        result["modules"][module] = {
            "cpu_s": seconds[module],
            "median_cpu_s": {arm: statistics.median(seconds[module][arm]) for arm in ARMS},
            "ratio_source_over_bytecode": {"median": statistics.median(ratios), "ci95": [low, high]},
        }
        print(
            f"{module}: source / bytecode CPU {statistics.median(ratios):.2f} [{low:.2f}, {high:.2f}] "
            f"(medians {result['modules'][module]['median_cpu_s']['source']:.1f} / "
            f"{result['modules'][module]['median_cpu_s']['bytecode']:.1f} s)"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
