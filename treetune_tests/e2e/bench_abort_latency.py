# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""How long over-sampling's abort takes, in decode steps, over a training run (issue 49's bench).

    .venv-current/bin/python treetune_tests/e2e/bench_abort_latency.py --model smollm2 --steps 21 \\
        --out treetune_specs/figures/abort_latency_current.json            # verl 0.9.1 (the venv picks the stack)
    .venv/bin/python treetune_tests/e2e/bench_abort_latency.py --model smollm2 --steps 21 \\
        --out treetune_specs/figures/abort_latency_pinned.json             # verl 0.7.1
    python treetune_tests/e2e/bench_abort_latency.py --analyze outputs/bench/abort-latency/verl-0.9.1

One ``test_entropy_e2e.sh`` run with over-sampling (``E2E_OVER_SAMPLE``, 0.25: 1 of 4 groups aborted each step) and
``TREETUNE_LOG_LEVEL=DEBUG``. Per training step after the first (its warm-up):

- ``abort_wait_s``: the step's wait from the target reached to the aborted rows settled (``rollout/abort_wait_s``,
  the same interval on both stacks, ``treetune_verl/timing.py``);
- the latency in decode steps, ``abort_wait_s`` over the run's decode step; its median and 95th percentile over the
  steps (the issue's bar: p50 <= 2, p95 <= 5);
- over-sampling's cost as the run logs it (``timing_s/treetune/over_sampling``, ``cpu_s/...``): the abort wait plus,
  on verl 0.7.1, the counter's calls that open and close the step (``over_sampling_beyond_abort_wait_s``).

A decode step's seconds come from the servers' own line for every request they served (``TREETUNE_LOG_LEVEL=DEBUG``,
``rollout/server.py`` ``_log_served``: tokens and seconds in the server): a request's seconds are a fixed part
(queueing, prefill) plus one decode step per token, so the slope of a least-squares line through the run's requests'
``(tokens, seconds)`` (those that ended by themselves: stop or length) is the decode step of the run's batches, and its
intercept the fixed part. A step's rollout divided by its longest response would count verl's fixed part (waking the
servers, scoring, TransferQueue) as decoding: once a collapsing run's answers are 2 tokens long (SmolLM2, lr 1e-4,
from step ~7) that reads ~0.6 s per decode step against ~0.13 s, and would flatter the latency five-fold. The line
needs requests of different lengths (fewer than :data:`MIN_LENGTH_SPAN` tokens between the shortest and the longest is
refused); a step's rows have them.

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
from treetune_verl.rollout.session import is_eval_request  # noqa: E402

REQUEST_LINE = re.compile(
    r"abort latency: request (\S+) of an aborted session returned ([0-9.]+) s after the abort, (\d+) tokens, stop (\S+)"
)
SERVED_LINE = re.compile(r"served: request (\S+), (\d+) tokens in ([0-9.]+) s, stop (\S+)")
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


COST_PREFIX, CPU_PREFIX = "timing_s/treetune/", "cpu_s/treetune/"  # treetune_verl/timing.py
MIN_LENGTH_SPAN = 8  # tokens between the run's shortest and longest longest-response, for the decode step's line


def decode_step_line(requests: list[tuple[int, float]]) -> tuple[float, float]:
    """(seconds per decode step, fixed seconds per request): the least-squares line of the requests' seconds in the
    server against their tokens (``(tokens, seconds)``, requests that ended by themselves).

    Raises:
        ValueError: the requests span fewer than :data:`MIN_LENGTH_SPAN` tokens (the slope is noise).
    """
    tokens = [n for n, _ in requests]
    if not requests or max(tokens) - min(tokens) < MIN_LENGTH_SPAN:
        span = f"{min(tokens)}-{max(tokens)}" if requests else "no"
        raise ValueError(
            f"the served requests span {span} tokens (< {MIN_LENGTH_SPAN}): too narrow to read a decode step from "
            f"(was the run logged at TREETUNE_LOG_LEVEL=DEBUG?)"
        )
    line = statistics.linear_regression(tokens, [s for _, s in requests])
    return line.slope, line.intercept


def step_figures(metrics: dict, decode_step_s: float) -> dict[str, float]:
    """One training step's abort wait, in seconds and in decode steps of ``decode_step_s``, and over-sampling's cost
    as the run logged it (``timing.py``): the step's wait on it (``over_sampling_s``: the abort wait and, on verl
    0.7.1, the counter's calls that open and close the step) and its CPU seconds."""
    wait = metrics["rollout/abort_wait_s"]
    return {
        "step": metrics["step"],
        "abort_wait_s": wait,
        "decode_steps": wait / decode_step_s,
        "over_sampling_s": metrics[f"{COST_PREFIX}over_sampling"],
        "over_sampling_cpu_s": metrics[f"{CPU_PREFIX}over_sampling"],
    }


def served_requests(text: str) -> list[tuple[int, float]]:
    """``(tokens, seconds)`` of every turn of a training row the servers logged as served that ended by itself (stop
    or length). The forecast's E is left out: with the e2e's ``max_running_requests=8`` its requests queue behind a
    step's 8 rows and decode after them, so their seconds at the length cap are twice a row's, which would steepen the
    line (a longer decode step, a flattered latency)."""
    return [
        (int(n), float(s))
        for rid, n, s, stop in SERVED_LINE.findall(text)
        if stop in ("stop", "length") and not is_eval_request(rid)
    ]


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
    log = "".join(
        path.read_text(errors="replace")
        for path in sorted(workdir.glob("*.log")) + [workdir / "output.txt"]
        if path.exists()
    )
    requests = served_requests(log)
    decode_step_s, fixed_s = decode_step_line(requests)
    per_step = [step_figures(m, decode_step_s) for m in steps]
    latency = [s["decode_steps"] for s in per_step]
    return {
        "workdir": str(workdir),
        "steps": per_step,
        "decode_steps_p50": percentile(latency, 0.5),
        "decode_steps_p95": percentile(latency, 0.95),
        "abort_wait_s_median": statistics.median(s["abort_wait_s"] for s in per_step),
        "abort_wait_s_p95": percentile([s["abort_wait_s"] for s in per_step], 0.95),
        "over_sampling_s_median": statistics.median(s["over_sampling_s"] for s in per_step),
        "over_sampling_beyond_abort_wait_s_median": statistics.median(
            s["over_sampling_s"] - s["abort_wait_s"] for s in per_step
        ),
        "over_sampling_cpu_s_median": statistics.median(s["over_sampling_cpu_s"] for s in per_step),
        "decode_step_s": decode_step_s,
        "request_fixed_s": fixed_s,
        "served_requests": len(requests),
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
            "TREETUNE_LOG_LEVEL": "DEBUG",  # the servers' served line (the decode step) and the abort's INFO lines
        }
        if args.forecast:
            env["E2E_FORECAST"] = "1"
        result = run_script(env, timeout=6 * 3600)
        (workdir / "output.txt").write_text(result.stdout + result.stderr)
        if result.returncode != 0:  # the e2e checks (e.g. a zero gradient after a collapse): the timing still holds
            print(f"e2e run exited {result.returncode} (its checks); reading its metrics all the same", file=sys.stderr)
        figures = {"settings": vars(args) | {"verl": importlib.metadata.version("verl")}, **analyze(workdir)}
    else:
        figures = {"settings": {"analyzed": str(args.analyze)}, **analyze(args.analyze)}
    print(json.dumps({k: v for k, v in figures.items() if k != "steps"}, indent=1, default=str))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
