# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Benchmark: the generation job's throughput against the bare patched Engine on the same prompts, side by side.

    python treetune_tests/treetune_verl/generation/bench_generation.py [--pairs 4] [--prompts 16] [--max-new-tokens 32]

One Engine (entropy installed) serves both variants, so they differ only in what the job adds around it: chat
templating, streaming with a bounded window, scoring, decoding token texts, the progress bar and the atomic parquet
shards (every ``--rows-per-shard`` responses, into a fresh directory each time). A = ``run_generation_job(cfg,
engine=...)``, B = ``engine.generate(input_ids=..., return_logprob=True)`` with the same prompts and sampling
parameters. Greedy decoding, so both produce the same tokens; each variant's output tokens/s is its own token count
over its wall time. Order ABBA per pair (each variant first as often as second), after one untimed warm-up of each.
Prints the per-pair ratios A/B, their median and a bootstrap 95 % CI, and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path


def bootstrap_ci(values: list[float], rounds: int = 10000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF model folder (default: packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rows-per-shard", type=int, default=64, help="the job's default; smaller = more shard writes")
    parser.add_argument("--out", default="outputs/bench/generation.json")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from treetune_verl.generation.config import resolve_config
    from treetune_verl.generation.job import load_items, prompt_ids, run_generation_job, start_engine
    from treetune_verl.model_cache import smollm2_path

    model = str(args.model or smollm2_path())
    base = {
        "model": {"path": model, "device": "cpu"},
        "input": {"limit": args.prompts},
        "sampling": {"temperature": 0.0, "max_new_tokens": args.max_new_tokens},
        "output": {"rows_per_shard": args.rows_per_shard},
    }
    cfg = resolve_config(base)
    tokenizer = AutoTokenizer.from_pretrained(model)
    items = load_items(cfg)
    ids = prompt_ids(tokenizer, items, None, args.max_new_tokens)
    engine = start_engine(cfg, model)
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0, "top_p": 1.0, "top_k": -1}

    def job() -> tuple[int, float]:
        with tempfile.TemporaryDirectory() as out_dir:
            t0 = time.perf_counter()
            result = run_generation_job({**base, "output": {**base["output"], "dir": out_dir}}, engine=engine)
            return result.output_tokens_new, time.perf_counter() - t0

    def bare() -> tuple[int, float]:
        t0 = time.perf_counter()
        outputs = engine.generate(input_ids=ids, sampling_params=params, return_logprob=True)
        seconds = time.perf_counter() - t0
        return sum(len(o["meta_info"]["output_token_entropy"]) for o in outputs), seconds

    variants = {"job": job, "bare": bare}
    runs: list[dict] = []
    try:
        job(), bare()  # warm-up: first-batch costs and the prefix cache, for both
        for pair in range(args.pairs):
            order = ("job", "bare") if pair % 2 == 0 else ("bare", "job")
            for name in order:
                tokens, seconds = variants[name]()
                runs.append({"pair": pair, "variant": name, "tokens": tokens, "seconds": seconds})
                print(f"pair {pair} {name:>4}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tok/s")
    finally:
        engine.shutdown()

    def rate(pair: int, name: str) -> float:
        run = next(r for r in runs if r["pair"] == pair and r["variant"] == name)
        return run["tokens"] / run["seconds"]

    ratios = [rate(p, "job") / rate(p, "bare") for p in range(args.pairs)]
    median, (low, high) = statistics.median(ratios), bootstrap_ci(ratios)
    report = {
        "model": model,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "pairs": args.pairs,
        "runs": runs,
        "ratios_job_over_bare": ratios,
        "median_ratio": median,
        "ci95": [low, high],
        "pass_0.95": median >= 0.95,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"job / bare output tokens/s: median {median:.3f} [95 % CI {low:.3f}, {high:.3f}] over {args.pairs} pairs")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
