# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Throughput of a patched sglang Engine (full-vocabulary and top-k entropy) against an unpatched one.

    python treetune_tests/treetune_verl/sglang/bench_entropy_throughput.py            # SmolLM2, CPU or GPU
    python treetune_tests/treetune_verl/sglang/bench_entropy_throughput.py --concurrency 16 --rounds 9

Each variant's Engine lives in its own worker process (the unpatched one never sees a patch, not even the
process-wide TokenizerManager one); all are started first, then measured in interleaved rounds (shuffled order
each round) on the same prompts with ``return_logprob=True`` and ``ignore_eos`` so every round decodes the same
number of tokens. Reports median output tokens/s per variant and the median of the per-round
patched/unpatched ratios; writes JSON. Goal on CPU with SmolLM2 at >= 8 concurrent requests: ratio >= 0.97.

Wall-clock rounds on a shared 2-core machine vary by tens of percent, so each round also records the CPU seconds
the variant's whole Engine (owner process, scheduler, detokenizer) spent: tokens per CPU-second is much less
sensitive to what else the machine does. The script also times the entropy
op itself (``entropy_for_sampling`` on ``[concurrency, vocab]`` logits, median of many calls, in this process) and
reports it as a share of the median unpatched decode step: a tight bound on the sampler-side cost.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import time
from pathlib import Path

# name -> entropy top-k (None = no patches). "control" is a second unpatched Engine: its ratio to "unpatched" is the
# A/A spread between two identical Engine instances, the floor below which a patched/unpatched ratio means nothing.
VARIANTS = {"unpatched": None, "control": None, "full": 0, "top_k": 20}
PROMPT = "Write a short story about a robot who learns to paint. Include {i} colours."


def _tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its descendants (the Engine's processes)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _worker(conn, model: str, top_k: int | None, device: str, args: dict) -> None:
    """Own one Engine; answer 'run' with (output tokens, wall seconds, CPU seconds) until 'stop'."""
    import sglang

    from treetune_verl.sglang.engine import engine_kwargs, install

    if top_k is not None:
        install(top_k=top_k, mode="raw")
    engine = sglang.Engine(**engine_kwargs(model, device, random_seed=0, log_level="error"))
    prompts = [PROMPT.format(i=i % 7 + 2) for i in range(args["concurrency"])]
    params = {"max_new_tokens": args["max_new_tokens"], "temperature": 1.0, "ignore_eos": True}
    conn.send("ready")
    try:
        while conn.recv() == "run":
            start, cpu_start = time.perf_counter(), _tree_cpu_seconds()
            outs = engine.generate(prompt=prompts, sampling_params=params, return_logprob=True)
            seconds, cpu_seconds = time.perf_counter() - start, _tree_cpu_seconds() - cpu_start
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
            if top_k is not None:
                assert all(
                    len(o["meta_info"]["output_token_entropy"]) == o["meta_info"]["completion_tokens"] for o in outs
                )
            conn.send((tokens, seconds, cpu_seconds))
    finally:
        engine.shutdown()


def entropy_op_seconds(model: str, concurrency: int, device: str, reps: int = 50) -> dict[str, float]:
    """Median seconds of one sampler-step entropy computation (full vocabulary and top-k) on random logits."""
    import torch
    from transformers import AutoConfig

    from treetune_verl.sglang.entropy import EntropyConfig
    from treetune_verl.sglang.scheduler_patches import entropy_for_sampling

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    vocab = AutoConfig.from_pretrained(model).vocab_size
    logits = torch.randn(concurrency, vocab, device=device) * 3
    temperatures = torch.ones(concurrency, 1, device=device)
    out = {}
    for name, top_k in VARIANTS.items():
        if top_k is None:
            continue
        config = EntropyConfig(top_k=top_k)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            entropy_for_sampling(logits, temperatures, config).tolist()  # includes the one host copy per step
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="HF model folder (default: packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/bench/entropy_throughput.json")
    args = parser.parse_args()

    from treetune_verl.model_cache import smollm2_path

    model = args.model or str(smollm2_path())
    ctx = mp.get_context("spawn")
    rng = random.Random(args.seed)
    start_order = list(VARIANTS)
    rng.shuffle(start_order)  # start order must not favour a variant (memory placement, warm caches)
    workers = {}
    for name in start_order:  # started one at a time: engine start-up is CPU-heavy
        top_k = VARIANTS[name]
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, model, top_k, args.device, vars(args)), daemon=False)
        proc.start()
        assert parent.recv() == "ready"
        workers[name] = (proc, parent)

    def run(name: str) -> tuple[int, float, float]:
        workers[name][1].send("run")
        return workers[name][1].recv()

    for name in VARIANTS:  # warm-up round, not measured
        run(name)
    rounds: list[dict[str, float]] = []
    cpu_rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        order = list(VARIANTS)
        rng.shuffle(order)
        tps, tpc = {}, {}
        for name in order:
            tokens, seconds, cpu_seconds = run(name)
            tps[name], tpc[name] = tokens / seconds, tokens / cpu_seconds
        rounds.append(tps)
        cpu_rounds.append(tpc)
        print(
            f"round {r}: " + "  ".join(f"{n}={tps[n]:.1f} tok/s ({tpc[n]:.1f} tok/cpu-s)" for n in VARIANTS),
            flush=True,
        )
    for proc, conn in workers.values():
        conn.send("stop")
        proc.join(timeout=60)

    median_tps = {n: statistics.median(r[n] for r in rounds) for n in VARIANTS}
    op_seconds = entropy_op_seconds(model, args.concurrency, args.device)
    step_seconds = args.concurrency / median_tps["unpatched"]  # one decode step yields one token per request
    op_share = {n: t / step_seconds for n, t in op_seconds.items()}
    ratios = {n: statistics.median(r[n] / r["unpatched"] for r in rounds) for n in VARIANTS if n != "unpatched"}
    cpu_ratios = {n: statistics.median(r[n] / r["unpatched"] for r in cpu_rounds) for n in VARIANTS if n != "unpatched"}
    result = {
        "model": model,
        "device": args.device,
        "concurrency": args.concurrency,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "engine_start_order": start_order,
        "median_tokens_per_s": median_tps,
        "median_ratio_vs_unpatched": ratios,
        "median_cpu_time_ratio_vs_unpatched": cpu_ratios,
        "entropy_op_seconds_per_step": op_seconds,
        "entropy_op_share_of_unpatched_step": op_share,
        "per_round_tokens_per_s": rounds,
        "per_round_tokens_per_cpu_s": cpu_rounds,
    }
    print("\nmedian output tokens/s: " + "  ".join(f"{n}={v:.1f}" for n, v in median_tps.items()))
    print("patched/unpatched (median of per-round ratios): " + "  ".join(f"{n}={v:.3f}" for n, v in ratios.items()))
    print(
        "patched/unpatched in tokens per CPU-second (median of per-round ratios): "
        + "  ".join(f"{n}={v:.3f}" for n, v in cpu_ratios.items())
    )
    print(
        "entropy op per step: "
        + "  ".join(
            f"{n}={op_seconds[n] * 1e3:.3f} ms ({op_share[n]:.2%} of a {step_seconds * 1e3:.0f} ms step)"
            for n in op_seconds
        )
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
