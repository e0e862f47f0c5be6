# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Peak memory of the probe's phases against B_E and B_U (SmolLM2 on CPU; the GPU when present). A script, not a test.

    python treetune_tests/treetune_verl/probe/bench_probe_memory.py [--sizes 2 8] [--rounds 2] [--layers N] [--json PATH]

Every (B_E, B_U) pair of ``--sizes`` runs in a fresh subprocess (pairs interleaved, the order reversed each round;
medians over rounds). A child loads the model, builds the main job's optimizer (AdamW, as verl's actor) and takes one
warm-up step (its state: two parameter-sized moments), samples E and U, then runs the phases as the main job does,
keeping each phase's outputs alive: X̄ naive, X̄ RB (``estimate_mean_X``), Δθ (``estimate_mean_Y``: Y passes + the
optimizer's dry-run step on fp64 copies), the ground truth (``true_entropy_change``: snapshot, real step on U,
measurement on E, restore). Per phase: peak RSS growth over the RSS before the first phase, read from the kernel's
exact high-water mark VmHWM (reset per phase through ``/proc/self/clear_refs``, no polling); on CUDA also
``torch.cuda.max_memory_allocated`` growth. Microbatching (``probe.mb_size_prompts``) should make every figure flat
in B_E and B_U: the per-microbatch activations are fixed and the buffers are parameter-sized.

``--layers N`` runs a truncated SmolLM2 (its first N decoder layers, its embeddings, vocabulary, tokenizer and chat
template; saved once to a temporary folder): each child is then quick, the parameter-sized buffers shrink and the
per-token activations (the vocabulary-wide logits dominate them) stay those of SmolLM2, so any growth with B stands
out more, not less.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TREETUNE_CACHE_DIR", str(REPO / ".cache"))

from treetune_verl.probe.components import ProbeComponents  # noqa: E402
from treetune_verl.probe.config import resolve_config  # noqa: E402
from treetune_verl.probe.ground_truth import true_entropy_change  # noqa: E402
from treetune_verl.probe.mixed_probe import estimate_mean_X, estimate_mean_Y, resolve_lr  # noqa: E402
from treetune_verl.probe.model_loading import load_model_and_tokenizer  # noqa: E402
from treetune_verl.probe.optimizers import build_optimizer, warm_up_optimizer_state  # noqa: E402
from treetune_verl.probe.task_sampler import ArithmeticBatchSampler  # noqa: E402

PHASES = ("X_naive", "X_rb", "Y_and_step", "ground_truth")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs=2, default=[2, 8], help="the two sizes of B_E and of B_U")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the four (B_E, B_U) pairs")
    parser.add_argument("--G", type=int, default=4)
    parser.add_argument("--mb", type=int, default=2, help="probe.mb_size_prompts")
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--layers", type=int, default=None, help="truncate SmolLM2 to its first N decoder layers")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="outputs/bench_probe_memory.json")
    parser.add_argument("--child", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process to its current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


def measure_phase(fn: Callable[[], Any], device: torch.device, base_rss_kib: int) -> tuple[Any, dict[str, float]]:
    """Run ``fn``; its result and ``{peak_rss_growth_MiB, seconds[, cuda_peak_growth_MiB]}`` (growth over base)."""
    reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    figures = {
        "peak_rss_growth_MiB": (_status_kib("VmHWM") - base_rss_kib) / 1024,
        "seconds": time.perf_counter() - start,
    }
    if device.type == "cuda":
        figures["cuda_peak_growth_MiB"] = (torch.cuda.max_memory_allocated() - cuda_base) / 2**20
    return out, figures


def child(args: argparse.Namespace) -> dict[str, Any]:
    B_E, B_U = args.child
    config = {
        "model": {"path": args.model_path, "device": args.device},
        "batch": {"B_E": B_E, "B_U": B_U, "G": args.G},
        "probe": {"mb_size_prompts": args.mb},
        "run": {"seed": args.seed},
    }
    cfg = resolve_config(config)
    model, tokenizer, _ = load_model_and_tokenizer(cfg.model)
    device = next(model.parameters()).device
    optimizer = build_optimizer(cfg.optimizer, [p for p in model.parameters() if p.requires_grad])
    lr = resolve_lr(cfg, optimizer)
    comps = {
        mode: ProbeComponents(model, {**config, "estimator": {"x_estimator_mode": mode}}, optimizer)
        for mode in ("naive", "rb_residual")
    }
    sampler = ArithmeticBatchSampler(model, tokenizer, cfg, args.seed)
    warm_up_optimizer_state(comps["naive"], [sampler.sample(min(B_E, B_U))[0]], args.mb, optimizer)
    E, _ = sampler.sample(B_E)
    U, _ = sampler.sample(B_U)
    base = _status_kib("VmRSS")
    kept: list[Any] = []  # each phase's outputs stay alive, as in the main job
    phases: dict[str, dict[str, float]] = {}
    steps = {
        "X_naive": lambda: estimate_mean_X(comps["naive"], E, args.mb),
        "X_rb": lambda: estimate_mean_X(comps["rb_residual"], E, args.mb),
        "Y_and_step": lambda: estimate_mean_Y(comps["naive"], U, args.mb, optimizer),
        "ground_truth": lambda: true_entropy_change(comps["naive"], [E], U, args.mb, optimizer, lr),
    }
    for name in PHASES:
        out, phases[name] = measure_phase(steps[name], device, base)
        kept.append(out)
    params = sum(p.numel() for p in comps["naive"].params)
    return {
        "B_E": B_E,
        "B_U": B_U,
        "T": int(E["sequences"].shape[-1]),
        "T_U": int(U["sequences"].shape[-1]),
        "base_rss_MiB": base / 1024,
        "param_buffer_fp32_MiB": params * 4 / 2**20,
        "phases": phases,
        "peak_rss_growth_MiB": max(p["peak_rss_growth_MiB"] for p in phases.values()),
    }


def truncated_smollm2(layers: int, folder: Path) -> Path:
    """SmolLM2-135M-Instruct with only its first ``layers`` decoder layers, saved as an HF folder under ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from treetune_verl.model_cache import smollm2_path

    source = str(smollm2_path())
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None) is not None:
        model.config.layer_types = model.config.layer_types[:layers]
    target = folder / f"smollm2-{layers}-layers"
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def run_child(args: argparse.Namespace, B_E: int, B_U: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(B_E), str(B_U), "--G", str(args.G), "--mb", str(args.mb)]
    cmd += ["--device", args.device, "--seed", str(args.seed)]
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child B_E={B_E} B_U={B_U} failed:\n{proc.stderr[-4000:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        torch.manual_seed(args.seed)
        print(json.dumps(child(args)))
        return
    start = time.perf_counter()
    if args.layers is not None:
        tmp = tempfile.TemporaryDirectory()
        args.model_path = str(truncated_smollm2(args.layers, Path(tmp.name)))
    pairs = list(itertools.product(args.sizes, args.sizes))
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {pair: [] for pair in pairs}
    for r in range(args.rounds):
        for pair in pairs if r % 2 == 0 else pairs[::-1]:
            result = run_child(args, *pair)
            runs[pair].append(result)
            print(
                f"round {r} B_E={pair[0]} B_U={pair[1]}: peak RSS growth {result['peak_rss_growth_MiB']:.0f} MiB "
                + ", ".join(f"{k} {v['peak_rss_growth_MiB']:.0f}" for k, v in result["phases"].items()),
                flush=True,
            )
    summary = []
    for (B_E, B_U), results in runs.items():
        row: dict[str, Any] = {"B_E": B_E, "B_U": B_U, "T_E": results[0]["T"], "T_U": results[0]["T_U"]}
        for name in PHASES:
            row[f"{name}_MiB"] = statistics.median(r["phases"][name]["peak_rss_growth_MiB"] for r in results)
            row[f"{name}_s"] = statistics.median(r["phases"][name]["seconds"] for r in results)
        row["peak_MiB"] = statistics.median(r["peak_rss_growth_MiB"] for r in results)
        row["peak_MiB_range"] = [
            min(r["peak_rss_growth_MiB"] for r in results),
            max(r["peak_rss_growth_MiB"] for r in results),
        ]
        summary.append(row)
    small, big = args.sizes
    by = {(row["B_E"], row["B_U"]): row for row in summary}
    ratios = {
        "peak(B_E big)/peak(B_E small) at B_U small": by[(big, small)]["peak_MiB"] / by[(small, small)]["peak_MiB"],
        "peak(B_U big)/peak(B_U small) at B_E small": by[(small, big)]["peak_MiB"] / by[(small, small)]["peak_MiB"],
        "peak(both big)/peak(both small)": by[(big, big)]["peak_MiB"] / by[(small, small)]["peak_MiB"],
    }
    results = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "args": vars(args),
        "param_buffer_fp32_MiB": runs[pairs[0]][0]["param_buffer_fp32_MiB"],
        "base_rss_MiB": runs[pairs[0]][0]["base_rss_MiB"],
        "summary": summary,
        "ratios": ratios,
        "runs": [r for results in runs.values() for r in results],
        "wall_s": time.perf_counter() - start,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(
        f"\n=== probe peak RSS growth (MiB, median of {args.rounds}), G={args.G}, mb={args.mb}; "
        f"one fp32 parameter buffer = {results['param_buffer_fp32_MiB']:.0f} MiB"
    )
    print(f"{'B_E':>4}{'B_U':>5}" + "".join(f"{name:>14}" for name in PHASES) + f"{'peak':>9}{'range':>14}")
    for row in summary:
        lo, hi = row["peak_MiB_range"]
        print(
            f"{row['B_E']:>4}{row['B_U']:>5}"
            + "".join(f"{row[f'{n}_MiB']:>14.0f}" for n in PHASES)
            + f"{row['peak_MiB']:>9.0f}{f'{lo:.0f}-{hi:.0f}':>14}"
        )
    for k, v in ratios.items():
        print(f"  {k} = {v:.3f}")
    print(f"wall {results['wall_s']:.0f}s; JSON: {path}")


if __name__ == "__main__":
    main()
