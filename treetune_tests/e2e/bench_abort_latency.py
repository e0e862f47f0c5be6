# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""How long over-sampling's abort takes, in decode steps, over a training run (issue 49's bench).

    .venv-current/bin/python treetune_tests/e2e/bench_abort_latency.py --model smollm2 --steps 21 \\
        --out treetune_specs/figures/abort_latency_current.json            # verl 0.9.1 (the venv picks the stack)
    .venv/bin/python treetune_tests/e2e/bench_abort_latency.py --model smollm2 --steps 21 \\
        --out treetune_specs/figures/abort_latency_pinned.json             # verl 0.7.1
    python treetune_tests/e2e/bench_abort_latency.py --analyze outputs/bench/abort-latency/verl-0.9.1

One ``test_entropy_e2e.sh`` run with over-sampling (``E2E_OVER_SAMPLE``, 0.25: 1 of 4 groups aborted each step) and
``TREETUNE_LOG_LEVEL=INFO``. Per training step after the first (its warm-up):

- ``abort_wait_s``: the step's wait from the target reached to the aborted rows settled (``rollout/abort_wait_s``,
  the same interval on both stacks, ``treetune_verl/timing.py``);
- a decode step's seconds: ``(timing_s/gen - abort_wait_s) / response_length/max``, the rollout up to the target over
  the longest trained response (an estimate: the batch shrinks as rows finish, so late decode steps are faster than
  this average, and the latency in decode steps below is, if anything, understated by it);
- the latency in decode steps, ``abort_wait_s`` over that; its median and 95th percentile over the steps (the issue's
  bar: p50 <= 2, p95 <= 5).

From the INFO lines: for every request of an aborted session in flight at the abort, the seconds from the abort to
its return and its stop reason (a stop other than ``abort`` is a turn the abort did not cut), and, on verl 0.9.1, the
replay buffer's split of the wait (the abort RPC, the polls until every aborted group is terminal, TransferQueue's
clear, the forget). JSON: the settings, every step's figures, the summary.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from treetune_tests.e2e.check_metrics import read_steps, training_steps  # noqa: E402
from treetune_tests.e2e.script import REPO_ROOT, run_script  # noqa: E402

REQUEST_LINE = re.compile(
    r"abort latency: request (\S+) of an aborted session returned ([0-9.]+) s after the abort, (\d+) tokens, stop (\S+)"
)
SAMPLER_LINE = re.compile(
    r"abort latency: (\d+) group\(s\): abort RPC ([0-9.]+) s, settled after (\d+) poll\(s\) ([0-9.]+) s, "
    r"clear ([0-9.]+) s, forget ([0-9.]+) s"
)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1), linear between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def step_figures(metrics: dict) -> dict[str, float]:
    """One training step's abort wait, decode-step estimate and latency in decode steps."""
    wait, gen, longest = metrics["rollout/abort_wait_s"], metrics["timing_s/gen"], metrics["response_length/max"]
    decode_step = (gen - wait) / longest
    return {
        "step": metrics["step"],
        "abort_wait_s": wait,
        "decode_step_s": decode_step,
        "decode_steps": wait / decode_step,
    }


def log_figures(text: str) -> dict[str, object]:
    """The INFO lines' requests (seconds after the abort, stop reasons) and the replay buffer's split of the wait."""
    requests = [(float(s), int(tokens), stop) for _, s, tokens, stop in REQUEST_LINE.findall(text)]
    splits = [tuple(float(v) for v in match) for match in SAMPLER_LINE.findall(text)]
    figures: dict[str, object] = {
        "requests": len(requests),
        "requests_not_cut": sum(stop != "abort" for _, _, stop in requests),
    }
    if requests:
        seconds = [s for s, _, _ in requests]
        figures |= {"request_return_s_p50": percentile(seconds, 0.5), "request_return_s_p95": percentile(seconds, 0.95)}
    if splits:
        for i, name in enumerate(("abort_rpc_s", "polls", "settle_s", "clear_s", "forget_s"), start=1):
            figures[f"sampler_{name}_median"] = statistics.median(split[i] for split in splits)
    return figures


def analyze(workdir: Path) -> dict[str, object]:
    steps = [m for m in training_steps(read_steps(workdir / "metrics.jsonl")) if m["step"] > 1]
    if not steps:
        raise ValueError(f"{workdir}: no training step after step 1 (run at least 2)")
    per_step = [step_figures(m) for m in steps]
    latency = [s["decode_steps"] for s in per_step]
    log = "".join(
        path.read_text(errors="replace")
        for path in sorted(workdir.glob("*.log")) + [workdir / "output.txt"]
        if path.exists()
    )
    return {
        "workdir": str(workdir),
        "steps": per_step,
        "decode_steps_p50": percentile(latency, 0.5),
        "decode_steps_p95": percentile(latency, 0.95),
        "abort_wait_s_median": statistics.median(s["abort_wait_s"] for s in per_step),
        "decode_step_s_median": statistics.median(s["decode_step_s"] for s in per_step),
        **log_figures(log),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--steps", type=int, default=21, help="training steps (the first is left out)")
    parser.add_argument("--over-sample", type=float, default=0.25)
    parser.add_argument("--forecast", action="store_true", help="with the live forecast on (E2E_FORECAST=1)")
    parser.add_argument("--workdir", type=Path, help="default: outputs/bench/abort-latency/verl-<version>")
    parser.add_argument("--analyze", type=Path, help="read a run that exists instead of starting one")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    if args.analyze is None:
        workdir = (
            args.workdir
            or REPO_ROOT / "outputs" / "bench" / "abort-latency" / f"verl-{importlib.metadata.version('verl')}"
        )
        env = {
            "E2E_MODEL": args.model,
            "E2E_STEPS": str(args.steps),
            "E2E_OVER_SAMPLE": str(args.over_sample),
            "E2E_WORKDIR": str(workdir),
            "TREETUNE_LOG_LEVEL": "INFO",
        }
        if args.forecast:
            env["E2E_FORECAST"] = "1"
        result = run_script(env, timeout=6 * 3600)
        (workdir / "output.txt").write_text(result.stdout + result.stderr)
        if result.returncode != 0:  # the e2e checks (e.g. a zero gradient after a collapse): the timing still holds
            print(f"e2e run exited {result.returncode} (its checks); reading its metrics all the same", file=sys.stderr)
        figures = {"settings": vars(args) | {"verl": importlib.metadata.version("verl")}, **analyze(workdir)}
    else:
        figures = analyze(args.analyze)
    print(json.dumps({k: v for k, v in figures.items() if k != "steps"}, indent=1, default=str))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
