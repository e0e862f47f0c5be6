# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the entropy probe on SmolLM2-135M-Instruct (CPU; the GPU when one is present). A script, not a test.

    python treetune_tests/treetune_verl/probe/bench_probe.py [--json PATH] [--repeats 5] [--B 4] [--big-B 32]

Measures, in one run:
1. Spread of ΔH₁ over repeats, naive vs RB (residual_mu): one fixed U batch (so Y is fixed), a fresh E batch per
   repeat; both estimators on the same E. Variants are interleaved (order alternates per repeat) after one discarded
   warm-up repeat; times are medians.
2. Time per phase: sampling, X̄ (each estimator), P Ȳ (passes and the mean each), dot, ground truth (snapshot +
   real step + measurement + restore), the covariance estimate, and one plain training step on the same tokens
   (forward+backward of -J over E and U, optimizer.step at lr 0) to express the probe's cost as a multiple of a
   training step.
3. ΔH_true (real SGD step, measured on each E) and the covariance estimate of Cui et al. (2025), -lr·Cov(log π, A)
   over U's response tokens, beside ΔH₁.
4. Peak memory of the probe passes (X rb + Y) for B_E = B_U = B and big B at a fixed microbatch size, each in a fresh
   subprocess: peak RSS growth over the RSS after loading and sampling (psutil, sampled every 2 ms) on CPU;
   torch.cuda.max_memory_allocated growth on GPU. Flat in B is the expected result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TREETUNE_CACHE_DIR", str(REPO / ".cache"))

from treetune_verl.probe.batch import iter_microbatches, validate_probe_batch  # noqa: E402
from treetune_verl.probe.components import ProbeComponents, probe_pass_context  # noqa: E402
from treetune_verl.probe.config import resolve_config  # noqa: E402
from treetune_verl.probe.covariance import covariance_entropy_change  # noqa: E402
from treetune_verl.probe.estimators import y_loss  # noqa: E402
from treetune_verl.probe.ground_truth import true_entropy_change  # noqa: E402
from treetune_verl.probe.mixed_probe import estimate_mean_X, estimate_mean_Y, predict_deltaH1  # noqa: E402
from treetune_verl.probe.model_loading import load_model_and_tokenizer  # noqa: E402
from treetune_verl.probe.task_sampler import ArithmeticBatchSampler  # noqa: E402
from treetune_verl.probe.teacher_forcing import teacher_force  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="HF folder (default: packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=5, help="measured repeats (after 1 warm-up repeat)")
    parser.add_argument("--B", type=int, default=4, help="B_E = B_U for the spread/timing part")
    parser.add_argument("--big-B", type=int, default=32, help="the larger B for the memory part")
    parser.add_argument("--G", type=int, default=4)
    parser.add_argument("--mb", type=int, default=2, help="probe.mb_size_prompts")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-5, help="SGD learning rate of the probed step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--json", default="outputs/bench_probe.json", help="where to write the results")
    parser.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def make_config(args: argparse.Namespace, B: int) -> dict:
    return {
        "model": {"path": args.model_path, "device": args.device},
        "generation": {"max_new_tokens": args.max_new_tokens},
        "batch": {"B_E": B, "B_U": B, "G": args.G},
        "probe": {"mb_size_prompts": args.mb},
        "optimizer": {"name": "sgd", "lr": args.lr},
        "run": {"seed": args.seed},
    }


def plain_train_step(comps: ProbeComponents, batches: list[dict], mb: int, optimizer: torch.optim.Optimizer) -> None:
    """Forward+backward of -J over every batch, one optimizer step: the training step on the probe's tokens."""
    total = sum(validate_probe_batch(b)[0] for b in batches)
    with probe_pass_context(comps.model, comps.params):
        optimizer.zero_grad(set_to_none=True)
        for batch in batches:
            P = validate_probe_batch(batch)[2]
            for part in iter_microbatches(batch, mb):
                with comps.autocast():
                    tf = teacher_force(comps.model, part, P, comps.temperature, comps.top_p, False)
                (-y_loss(tf, part["advantages"], part["max_lengths"]) / total).backward()
        optimizer.step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def stopwatch(device: torch.device, sink: dict, key: str) -> Iterator[None]:
    """Store the seconds spent in the block under ``sink[key]`` (device-synchronised)."""
    _sync(device)
    start = time.perf_counter()
    yield
    _sync(device)
    sink[key] = time.perf_counter() - start


def spread_and_timing(args: argparse.Namespace) -> dict:
    cfg = resolve_config(make_config(args, args.B))
    model, tokenizer, name = load_model_and_tokenizer(cfg.model)
    device = next(model.parameters()).device
    sampler = ArithmeticBatchSampler(model, tokenizer, cfg, args.seed)
    comps = {
        "naive": ProbeComponents(model, {**make_config(args, args.B), "estimator": {"x_estimator_mode": "naive"}}),
        "rb_residual": ProbeComponents(
            model, {**make_config(args, args.B), "estimator": {"x_estimator_mode": "rb_residual"}}
        ),
    }
    main = comps["rb_residual"]
    zero_lr_sgd = torch.optim.SGD(main.params, lr=0.0)  # same compute as a step, weights unchanged
    U, U_info = sampler.sample(args.B)
    rows = []
    times: dict[str, list[float]] = {}
    for r in range(args.repeats + 1):  # repeat 0 is a warm-up (allocator, μ baseline), discarded
        row: dict = {}
        with stopwatch(device, row, "t_sample"):
            E, _ = sampler.sample(args.B)
        order = ["naive", "rb_residual"] if r % 2 == 0 else ["rb_residual", "naive"]
        means_X = {}
        for variant in order:
            with stopwatch(device, row, f"t_X[{variant}]"):
                means_X[variant], _ = estimate_mean_X(comps[variant], E, args.mb)
        with stopwatch(device, row, "t_Y"):
            mean_Y = estimate_mean_Y(main, U, args.mb, None)  # no optimizer: P = identity (the SGD step)
        for variant in order:
            with stopwatch(device, row, f"t_dot[{variant}]"):
                _, row[f"deltaH1[{variant}]"] = predict_deltaH1(means_X[variant], mean_Y, args.lr)
        with stopwatch(device, row, "t_ground_truth"):
            truth = true_entropy_change(main, [E], U, args.mb, None, args.lr)
        row["deltaH_true"] = truth["deltaH_true"][0]
        row["min_ess"] = truth["min_ess"][0]
        row["t_real_step_inside_ground_truth"] = truth["train_step_s"]
        with stopwatch(device, row, "t_cov"):
            row["cui_cov"] = covariance_entropy_change(main, U, args.mb, args.lr)
        with stopwatch(device, row, "t_train_step"):
            plain_train_step(main, [E, U], args.mb, zero_lr_sgd)
        print(
            f"repeat {r}{' (warm-up)' if r == 0 else ''}: " + ", ".join(f"{k}={v:.4g}" for k, v in row.items()),
            flush=True,
        )
        if r > 0:
            rows.append(row)
            for k, v in row.items():
                if k.startswith("t_"):
                    times.setdefault(k, []).append(v)
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict = {"model": name, "device": str(device), "B": args.B, "G": args.G, "mb": args.mb, "lr": args.lr}
    out["mean_reward_U"] = U_info["mean_reward"]
    out["rows"] = rows
    out["median_times_s"] = med
    for variant in ("naive", "rb_residual"):
        values = [row[f"deltaH1[{variant}]"] for row in rows]
        out[f"deltaH1[{variant}]"] = {
            "median": statistics.median(values),
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None,
        }
        probe_s = med[f"t_X[{variant}]"] + med["t_Y"] + med[f"t_dot[{variant}]"]
        out[f"probe_s[{variant}]"] = probe_s
        out[f"probe_over_train_step[{variant}]"] = probe_s / med["t_train_step"]
    if out["deltaH1[naive]"]["std"] and out["deltaH1[rb_residual]"]["std"]:
        out["std_ratio_naive_over_rb"] = out["deltaH1[naive]"]["std"] / out["deltaH1[rb_residual]"]["std"]
    truths = [row["deltaH_true"] for row in rows]
    out["deltaH_true"] = {"median": statistics.median(truths), "mean": statistics.fmean(truths)}
    out["cui_covariance_deltaH"] = statistics.median(row["cui_cov"] for row in rows)
    return out


def memory_child(args: argparse.Namespace) -> dict:
    """Peak memory growth of X (rb_residual) + Y for B = args.memory_child; runs in its own process."""
    import psutil

    B = args.memory_child
    config = make_config(args, B)
    cfg = resolve_config(config)
    model, tokenizer, _ = load_model_and_tokenizer(cfg.model)
    device = next(model.parameters()).device
    sampler = ArithmeticBatchSampler(model, tokenizer, cfg, args.seed)
    E, _ = sampler.sample(B)
    U, _ = sampler.sample(B)
    comps = ProbeComponents(model, config)
    process = psutil.Process()
    baseline = process.memory_info().rss
    peak = baseline
    done = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.002)

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_base = torch.cuda.memory_allocated()
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    start = time.perf_counter()
    comps.accumulate_sum_X(E, args.mb)
    comps.accumulate_sum_Y(U, args.mb)
    elapsed = time.perf_counter() - start
    done.set()
    thread.join()
    result = {"B": B, "mb": args.mb, "rss_growth_MiB": (peak - baseline) / 2**20, "probe_s": elapsed}
    result["param_buffer_MiB"] = sum(p.numel() for p in comps.params) * 4 / 2**20
    if device.type == "cuda":
        result["cuda_peak_growth_MiB"] = (torch.cuda.max_memory_allocated() - cuda_base) / 2**20
    return result


def memory_profile(args: argparse.Namespace) -> list[dict]:
    results = []
    for B in (args.B, args.big_B):
        cmd = [sys.executable, __file__, "--memory-child", str(B), "--mb", str(args.mb), "--G", str(args.G)]
        cmd += ["--max-new-tokens", str(args.max_new_tokens), "--device", args.device, "--seed", str(args.seed)]
        if args.model_path:
            cmd += ["--model-path", args.model_path]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
        results.append(json.loads(line))
        print(f"memory B={B}: {results[-1]}", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.memory_child is not None:
        print(json.dumps(memory_child(args)))
        return
    start = time.perf_counter()
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]), **spread_and_timing(args)}
    if not args.skip_memory:
        results["memory"] = memory_profile(args)
    results["wall_s"] = time.perf_counter() - start
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    med = results["median_times_s"]
    print("\n=== entropy probe benchmark:", results["model"], "on", results["device"])
    print(f"B_E = B_U = {args.B}, G = {args.G}, mb = {args.mb}, SGD lr = {args.lr:g}, {args.repeats} repeats (medians)")
    for variant in ("naive", "rb_residual"):
        d = results[f"deltaH1[{variant}]"]
        std = "n/a" if d["std"] is None else f"{d['std']:.3e}"
        print(
            f"  {variant:<12} dH1 median {d['median']:+.3e}  std {std}  X {med[f't_X[{variant}]']:.2f}s  "
            f"probe {results[f'probe_s[{variant}]']:.2f}s = {results[f'probe_over_train_step[{variant}]']:.2f}x train step"
        )
    if "std_ratio_naive_over_rb" in results:
        print(f"  std ratio naive/rb = {results['std_ratio_naive_over_rb']:.2f}")
    print(
        f"  dH_true median {results['deltaH_true']['median']:+.3e}   Cui cov estimate {results['cui_covariance_deltaH']:+.3e}"
    )
    print("  times (median s): " + ", ".join(f"{k[2:]}={v:.2f}" for k, v in med.items()))
    for m in results.get("memory", []):
        extra = f", cuda peak growth {m['cuda_peak_growth_MiB']:.0f} MiB" if "cuda_peak_growth_MiB" in m else ""
        print(
            f"  memory B={m['B']}: RSS peak growth {m['rss_growth_MiB']:.0f} MiB (param buffer {m['param_buffer_MiB']:.0f} MiB){extra}, {m['probe_s']:.1f}s"
        )
    print(f"  wall {results['wall_s']:.0f}s; JSON: {path}")


if __name__ == "__main__":
    main()
