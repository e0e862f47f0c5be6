# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Throughput of a patched sglang Engine (full-vocabulary and top-k entropy, the sampled support) against an unpatched one.

    python treetune_tests/treetune_verl/sglang/bench_entropy_throughput.py            # SmolLM2, CPU or GPU
    python treetune_tests/treetune_verl/sglang/bench_entropy_throughput.py --rounds 20 --window-s 20
    python treetune_tests/treetune_verl/sglang/bench_entropy_throughput.py --variants unpatched,control,tempered,support \
        --top-p 0.8 --out outputs/bench/support_throughput.json        # issue 48: mode "support" at top-p 0.8

Up to six Engines (``--variants``), each in its own worker process (an unpatched one never sees a patch, not even the
process-wide TokenizerManager one): ``unpatched`` and ``control`` (two identical unpatched Engines: their ratio is the
A/A floor of the method), ``full`` (full-vocabulary entropy), ``top_k`` (top-20 entropy), ``tempered`` (mode
``tempered``: the same at each request's temperature) and ``support`` (entropy mode
``support``: each token's sampled support, ``sglang/support_capture.py``). Every request samples at ``--top-p``
(1.0 by default: sglang's untruncated path; below 1 its truncating one, for every Engine alike). Every
request uses ``return_logprob=True`` and ``ignore_eos``, so each batch decodes exactly ``concurrency x
max_new_tokens`` tokens. Two schedules:

``paired`` (default on CPU). Two Engines run *at the same time* on the same cores (torch threads = half the cores
per Engine; the OS spreads both over all of them) for a window of ``--window-s`` seconds;
each keeps ``concurrency`` requests in flight by submitting batch after batch, and its rate is the tokens of the
batches that ended inside the window over the time to the last of them (the batch that crosses the deadline is
discarded, so every counted second had the other Engine running beside it). What slows a shared machine (a
neighbour's memory traffic, stolen CPU time) then slows both Engines of a window alike, and their ratio keeps only
the difference. Each round runs every pair of the four Engines once, in shuffled order, so that every Engine
runs equally often (one Engine in every window and the others idle in between favoured it by ~2.5 %); each patched
variant is compared with both unpatched Engines (two ratios per round, pooled as ``full/unpatched``).

``sequential`` (default on CUDA, and the only sensible one there). One Engine at a time, the whole machine, one
batch each, in shuffled order each round.

Reported: median output tokens/s per variant, and per comparison the median of its per-window (per-round) ratios
with a distribution-free 95 % confidence interval of that median (order statistics of the ratios).
Goal on CPU with SmolLM2 at >= 8 concurrent requests: ratio >= 0.97. The script also times the entropy op itself
(``entropy_for_sampling`` plus its one ``.tolist()`` on ``[concurrency, vocab]`` logits, in this process, with the
Engines' thread count) as a share of the unpatched decode step; for ``support``, what ``forward_with_support`` adds
to sglang's own sampling of the step (softmax in place, then its sampler at ``--top-p``) with the host copy of the
rows: the two timed alternately on the same logits, the median of the differences. Writes JSON.

Why not sequential on CPU: on a shared 2-core virtual machine consecutive 15 s runs of one and the same Engine
differ by 10-15 % (CV) with what the host's other tenants do, and the A/A ratio of two identical Engines read
0.90-1.03 over 7-9 rounds. Side by side, one window's A/A ratio has a standard deviation of ~2-4 %, and 10 rounds
(20 windows per patched variant) bound the median to about +-2 %. Pinning each Engine to its own core was no better.
Figures and their history: treetune_specs/2026-11-22-sglang-entropy-extraction.md.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import statistics
import time
from pathlib import Path

# name -> entropy (top_k, mode) (None = no patches). Two unpatched Engines: their ratio is the A/A floor of the method;
# the sequential schedule takes every ratio against REFERENCE, the paired one against both unpatched Engines.
ALL_VARIANTS = {
    "unpatched": None,
    "control": None,
    "full": (0, "raw"),
    "top_k": (20, "raw"),
    "tempered": (0, "tempered"),
    "support": (0, "support"),
}
DEFAULT_VARIANTS = "unpatched,control,full,top_k"
VARIANTS = {name: ALL_VARIANTS[name] for name in DEFAULT_VARIANTS.split(",")}  # main() sets the run's
REFERENCE = "unpatched"
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


def _worker(conn, model: str, entropy: tuple[int, str] | None, device: str, args: dict) -> None:
    """Own one Engine and answer the parent's commands until 'stop'.

    ``("batch",)`` -> (output tokens, wall seconds, CPU seconds of the Engine's processes) of one batch;
    ``("window", start, deadline)`` -> (tokens, seconds) of the batches run back to back from the wall-clock time
    ``start`` that ended before ``deadline``, seconds counted from ``start`` to the end of the last of them.
    """
    if args["threads"]:  # before torch is imported here and in the scheduler process spawned below
        os.environ["OMP_NUM_THREADS"] = str(args["threads"])
    import sglang

    from treetune_verl.sglang.engine import engine_kwargs, install

    if entropy is not None:
        install(top_k=entropy[0], mode=entropy[1])
    overrides = {"mem_fraction_static": args["mem_fraction_static"]} if args["mem_fraction_static"] else {}
    engine = sglang.Engine(**engine_kwargs(model, device, random_seed=0, log_level="error", **overrides))
    prompts = [PROMPT.format(i=i % 7 + 2) for i in range(args["concurrency"])]
    params = {"max_new_tokens": args["max_new_tokens"], "temperature": 1.0, "top_p": args["top_p"], "ignore_eos": True}

    def batch() -> int:
        outs = engine.generate(prompt=prompts, sampling_params=params, return_logprob=True)
        if entropy is not None:
            assert all(len(o["meta_info"]["output_token_entropy"]) == o["meta_info"]["completion_tokens"] for o in outs)
        if entropy is not None and entropy[1] == "support":
            assert all(len(o["meta_info"]["output_token_support"]) == o["meta_info"]["completion_tokens"] for o in outs)
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    batch()  # warm-up (first prefill fills the radix cache), not measured
    conn.send("ready")
    try:
        while (command := conn.recv())[0] != "stop":
            if command[0] == "batch":
                start, cpu_start = time.perf_counter(), _tree_cpu_seconds()
                tokens = batch()
                conn.send((tokens, time.perf_counter() - start, _tree_cpu_seconds() - cpu_start))
            else:
                _, start, deadline = command
                time.sleep(max(0.0, start - time.time()))
                tokens, last_end = 0, start
                while True:
                    batch_tokens = batch()
                    if time.time() > deadline:
                        break
                    tokens, last_end = tokens + batch_tokens, time.time()
                conn.send((tokens, last_end - start))
    finally:
        engine.shutdown()


def median_ci95(values: list[float]) -> tuple[float, float]:
    """Distribution-free confidence interval (>= 95 %) of the median: order statistics of a Binomial(n, 1/2)."""
    ordered, n = sorted(values), len(values)
    k = 0  # the largest k with P(Binomial(n, 1/2) < k) <= 0.025; the interval is [x_(k), x_(n-k+1)] (1-based)
    while sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= 0.025:
        k += 1
    if k == 0:
        return float("nan"), float("nan")  # too few values for a 95 % interval (n < 6)
    return ordered[k - 1], ordered[n - k]


def entropy_op_seconds(
    model: str, concurrency: int, device: str, threads: int, top_p: float, reps: int = 100
) -> dict[str, float]:
    """Median seconds of one sampler-step entropy computation (and its host copy) on random logits, per variant."""
    import torch
    from transformers import AutoConfig

    from treetune_verl.sglang.config import EntropyConfig
    from treetune_verl.sglang.entropy import entropy_for_sampling

    if threads:
        torch.set_num_threads(threads)
    vocab = AutoConfig.from_pretrained(model).vocab_size
    logits = torch.randn(concurrency, vocab, device=device) * 3
    temperatures = torch.ones(concurrency, 1, device=device)
    out = {}
    for name, entropy in VARIANTS.items():
        if entropy is None:
            continue
        if entropy[1] == "support":
            out[name] = support_op_seconds(logits, top_p, reps)
            continue
        config = EntropyConfig(top_k=entropy[0], mode=entropy[1])
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            entropy_for_sampling(logits, temperatures, config).tolist()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def support_op_seconds(logits, top_p: float, reps: int) -> float:
    """Median seconds ``forward_with_support`` (and the host copy of its rows) adds to sglang's sampling of one step:
    sglang's ``Sampler.forward`` steps at temperature 1 (softmax in place, then its torch sampler at ``top_p``, or its
    direct draw at 1), timed alone and inside ``forward_with_support``, alternately, on copies of the same logits."""
    from types import SimpleNamespace

    import torch
    from sglang.srt.layers import sampler

    from treetune_verl.patching import restore
    from treetune_verl.sglang.support_capture import forward_with_support, install_support_sampling

    n = logits.shape[0]
    info = SimpleNamespace(
        is_all_greedy=False,
        need_top_p_sampling=top_p < 1.0,
        need_top_k_sampling=False,
        need_min_p_sampling=False,
        temperatures=torch.ones(n, 1, device=logits.device),
        top_ks=torch.full((n,), 1 << 30, dtype=torch.int32, device=logits.device),
        top_ps=torch.full((n,), top_p, device=logits.device),
        min_ps=torch.zeros(n, device=logits.device),
    )

    def sglang_sampling(step_logits):  # what upstream's Sampler.forward does to the step (layers/sampler.py)
        step_logits.div_(info.temperatures)
        step_logits[:] = torch.softmax(step_logits, dim=-1)
        if top_p < 1.0:
            return sampler.top_k_top_p_min_p_sampling_from_probs_torch(
                step_logits, info.top_ks, info.top_ps, info.min_ps, False, None, None
            )
        return sampler.sampling_from_probs_torch(step_logits)

    install_support_sampling()
    try:
        extra = []
        for _ in range(reps):
            alone, within = logits.clone(), logits.clone()
            start = time.perf_counter()
            sglang_sampling(alone).tolist()
            bare = time.perf_counter() - start
            start = time.perf_counter()
            ids, support = forward_with_support(functools.partial(sglang_sampling, within), within, info)
            ids.tolist()
            support.rows()
            extra.append(time.perf_counter() - start - bare)
    finally:
        restore(sampler, "top_k_top_p_min_p_sampling_from_probs_torch")
    return statistics.median(extra)


def run_sequential(workers: dict, rounds: int, rng: random.Random) -> list[dict[str, dict[str, float]]]:
    """One batch per variant per round, one Engine at a time, shuffled order; per round {variant: figures}."""
    results = []
    for r in range(rounds):
        order = list(workers)
        rng.shuffle(order)
        row = {}
        for name in order:
            workers[name][1].send(("batch",))
            tokens, seconds, cpu_seconds = workers[name][1].recv()
            row[name] = {"tokens_per_s": tokens / seconds, "tokens_per_cpu_s": tokens / cpu_seconds}
        results.append(row)
        print(f"round {r}: " + "  ".join(f"{n}={row[n]['tokens_per_s']:.1f} tok/s" for n in workers), flush=True)
    return results


def run_paired(workers: dict, rounds: int, window_s: float, rng: random.Random) -> list[list[dict]]:
    """Each round: one window for every pair of Engines (shuffled order), the two run side by side.

    Every Engine takes part in the same number of windows, so none is favoured by having run just before (an Engine
    that sat idle for a while runs its next window slower: with one Engine in every window, the A/A ratio read
    0.975). Returns per round a list of ``{"pair": [a, b], "tokens_per_s": {a: rate, b: rate}}``.
    """
    pairs = list(itertools.combinations(workers, 2))
    results = []
    for r in range(rounds):
        rng.shuffle(pairs)
        windows = []
        for pair in pairs:
            start = time.time() + 0.2
            for name in pair:
                workers[name][1].send(("window", start, start + window_s))
            rates = {}
            for name in pair:
                tokens, seconds = workers[name][1].recv()
                if not tokens:
                    raise SystemExit(f"window of {window_s} s too short for one batch; raise --window-s")
                rates[name] = tokens / seconds
            windows.append({"pair": list(pair), "tokens_per_s": rates})
        results.append(windows)
        print(
            f"round {r}: "
            + "  ".join(
                f"{b}/{a}={w['tokens_per_s'][b] / w['tokens_per_s'][a]:.3f}" for w in windows for a, b in [w["pair"]]
            ),
            flush=True,
        )
    return results


def paired_ratios(rounds: list[list[dict]]) -> dict[str, list[float]]:
    """Per comparison, the ratios of the windows that ran it: each patched variant against each unpatched Engine
    (pooled as ``name/unpatched``), the A/A ``control/unpatched``, and patched against patched."""
    names = list(VARIANTS)
    ratios: dict[str, list[float]] = {}
    for window in (w for windows in rounds for w in windows):
        # Numerator: the patched Engine of the pair, else the later one in VARIANTS (control/unpatched, top_k/full).
        num, den = sorted(window["pair"], key=lambda n: (VARIANTS[n] is not None, names.index(n)), reverse=True)
        key = f"{num}/{'unpatched' if VARIANTS[den] is None else den}"
        ratios.setdefault(key, []).append(window["tokens_per_s"][num] / window["tokens_per_s"][den])
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="HF model folder (default: packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--schedule", choices=["auto", "paired", "sequential"], default="auto")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16, help="per request per batch")
    parser.add_argument("--rounds", type=int, default=10, help="paired on CPU: ~100 s per round")
    parser.add_argument("--window-s", type=float, default=12.0, help="paired schedule: seconds per window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/bench/entropy_throughput.json")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of: {', '.join(ALL_VARIANTS)}")
    parser.add_argument("--top-p", type=float, default=1.0, help="every request's top-p (1: sglang's untruncated path)")
    args = parser.parse_args()
    names = [n for n in args.variants.split(",") if n]
    if REFERENCE not in names or set(names) - set(ALL_VARIANTS) or len(set(names)) != len(names):
        parser.error(f"--variants: distinct names of {', '.join(ALL_VARIANTS)}, including {REFERENCE}; got {names}")
    if not 0.0 < args.top_p <= 1.0:
        parser.error(f"--top-p must be in (0, 1], got {args.top_p}")
    VARIANTS.clear()
    VARIANTS.update({name: ALL_VARIANTS[name] for name in names})

    import torch

    from treetune_verl.model_cache import smollm2_path

    model = args.model or str(smollm2_path())
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    schedule = ("sequential" if device == "cuda" else "paired") if args.schedule == "auto" else args.schedule
    cores = len(os.sched_getaffinity(0))
    if schedule == "paired" and cores < 2:
        raise SystemExit("the paired schedule needs at least 2 CPU cores; use --schedule sequential")
    threads = cores // 2 if schedule == "paired" else 0  # 0: the Engines' default
    ctx = mp.get_context("spawn")
    rng = random.Random(args.seed)
    start_order = list(VARIANTS)
    rng.shuffle(start_order)  # start order must not favour a variant (memory placement, warm caches)
    workers = {}
    for i, name in enumerate(start_order):  # one at a time: Engine start-up is CPU-heavy and sizes memory
        # On CUDA sglang sizes each Engine's pool as if it owned the GPU (rest = free - total * (1 - fraction)),
        # so Engines that share one GPU need increasing fractions: each then gets ~0.9/len(VARIANTS) of it.
        fraction = 0.9 * (i + 1) / len(VARIANTS) if device == "cuda" else None
        worker_args = {**vars(args), "threads": threads, "mem_fraction_static": fraction}
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, model, VARIANTS[name], device, worker_args))
        proc.start()
        assert parent.recv() == "ready"
        workers[name] = (proc, parent)
    workers = {name: workers[name] for name in VARIANTS}

    try:
        if schedule == "paired":
            rounds = run_paired(workers, args.rounds, args.window_s, rng)
            ratios = paired_ratios(rounds)
            median_tps = {
                n: statistics.median(w["tokens_per_s"][n] for ws in rounds for w in ws if n in w["tokens_per_s"])
                for n in VARIANTS
            }
        else:
            rounds = run_sequential(workers, args.rounds, rng)
            ratios = {
                f"{n}/unpatched": [r[n]["tokens_per_s"] / r[REFERENCE]["tokens_per_s"] for r in rounds]
                for n in VARIANTS
                if n != REFERENCE
            }
            median_tps = {n: statistics.median(r[n]["tokens_per_s"] for r in rounds) for n in VARIANTS}
    finally:
        for proc, conn in workers.values():
            conn.send(("stop",))
            proc.join(timeout=60)

    summary = {n: {"median": statistics.median(v), "ci95": median_ci95(v)} for n, v in ratios.items()}
    op_seconds = entropy_op_seconds(model, args.concurrency, device, threads, args.top_p)
    step_seconds = args.concurrency / median_tps[REFERENCE]  # one decode step yields one token per request
    op_share = {n: t / step_seconds for n, t in op_seconds.items()}
    result = {
        "model": model,
        "device": device,
        "schedule": schedule,
        "threads_per_engine": threads or "default",
        "concurrency": args.concurrency,
        "max_new_tokens": args.max_new_tokens,
        "top_p": args.top_p,
        "variants": {name: list(entropy) if entropy else None for name, entropy in VARIANTS.items()},
        "rounds": args.rounds,
        "window_s": args.window_s if schedule == "paired" else None,
        "engine_start_order": start_order,
        "median_tokens_per_s": median_tps,
        "ratios": summary,
        "entropy_op_seconds_per_step": op_seconds,
        "entropy_op_share_of_unpatched_step": op_share,
        "per_round": rounds,
    }
    print(f"\nschedule={schedule}  median output tokens/s: " + "  ".join(f"{n}={v:.1f}" for n, v in median_tps.items()))
    for name, s in summary.items():
        low, high = s["ci95"]
        print(
            f"{name} ({len(ratios[name])} windows/rounds): median {s['median']:.3f}  95% CI of the median [{low:.3f}, {high:.3f}]"
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
