# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The early warning replayed over recorded runs: what the rule (``early_warning.py``) with these settings would have
said at each step, from a run's ``metrics.jsonl`` alone (the forecast's ``probe/*`` metrics verl's file logger wrote).

    python -m treetune_verl.forecast.replay_warning outputs/study/collapsing/metrics.jsonl outputs/study/stable/metrics.jsonl
    python -m treetune_verl.forecast.replay_warning RUN.jsonl --set on_policy=true horizon=10

Per run: the collapse step (rollout entropy below ½ of the first step's, as the study counts it), the steps the rule
warns at, and the first warning's lead. How the rule was judged on runs recorded before it changed
(``treetune_specs/2026-11-28-forecast-calibration.md``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from treetune_verl.forecast.calibration import collapse_step, read_run
from treetune_verl.forecast.early_warning import PREFIX, TOKEN, EarlyWarning, WarningSettings, warning_settings


@dataclass(frozen=True)
class Replay:
    """One run under the rule: its collapse step, the steps warned at, the first warning's lead (steps)."""

    run: str
    collapse_step: int | None
    warned: tuple[int, ...]

    @property
    def lead(self) -> int | None:
        if self.collapse_step is None or not self.warned or self.warned[0] > self.collapse_step:
            return None
        return self.collapse_step - self.warned[0]


def replay(metrics_jsonl: str | Path, settings: WarningSettings) -> Replay:
    """Fold each forecast step's metrics, in step order, through a fresh :class:`EarlyWarning`.

    Raises:
        ValueError: a line that is not a verl file-logger record, or no training step (``calibration.read_run``).
        KeyError: a forecast step without a metric the rule reads (naming it).
    """
    steps = read_run(metrics_jsonl)
    records = {}
    for line in Path(metrics_jsonl).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            records.setdefault(int(record["step"]), {}).update(record["data"])
    warning, warned = EarlyWarning(settings), []
    for step in sorted(records):
        metrics = records[step]
        if TOKEN + "deltaH1" not in metrics:
            continue  # no forecast at this step (entropy_forecast.every > 1)
        if warning.observe(metrics, log=False)[PREFIX + "collapse"] >= 1.0:
            warned.append(step)
    return Replay(str(metrics_jsonl), collapse_step(steps), tuple(warned))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="metrics.jsonl of verl's file logger, one per run")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="early_warning settings")
    args = parser.parse_args(argv)
    section = OmegaConf.to_container(OmegaConf.from_dotlist(args.set)) if args.set else None
    settings = warning_settings(section, "--set")
    for run in args.runs:
        result = replay(run, settings)
        print(
            f"{result.run}: collapse step {result.collapse_step}, warnings at {list(result.warned)}, lead {result.lead}"
        )


if __name__ == "__main__":
    main()
