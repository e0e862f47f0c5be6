# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The entropy op on a GPU, beside the sampler's own work on the same logits (torch only: no sglang needed).

    python treetune_tests/treetune_verl/sglang/bench_entropy_op_gpu.py --out outputs/bench/entropy_op_gpu.json

Per decode step our sampler hook adds ``entropy_for_sampling`` (full vocabulary or top-k) plus one device-to-host
copy of ``[bs]`` values. This times exactly that (CUDA events, one ``.tolist()`` included) against what sglang's
standard sampling path already does with the same ``[bs, V]`` logits (``layers/sampler.py``: divide by temperature,
softmax in place, sample with ``torch.multinomial``, ``log`` of the probabilities for the returned logprobs), for
batch sizes and vocabularies of the models our users train (SmolLM2 49,152; Qwen2.5 151,936) in bf16 and fp32
logits. The two are timed alternately, ``--repeats`` times each, and the report gives per shape the median of each
and the median of the per-repeat ratios with a distribution-free 95 % CI. It is a share of the sampler, not of a
whole decode step (the model's forward, which is far larger, is not run here). Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))

from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95  # noqa: E402
from treetune_verl.sglang.config import EntropyConfig  # noqa: E402
from treetune_verl.sglang.entropy import entropy_for_sampling  # noqa: E402

VOCABS = {"smollm2": 49152, "qwen2.5": 151936}


def sampler_step(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """sglang's standard sampling path on a copy of the logits (it works in place)."""
    probs = logits.float().div_(temperatures)
    probs[:] = torch.softmax(probs, dim=-1)
    ids = torch.multinomial(probs, num_samples=1)
    logprobs = torch.log(probs)
    return torch.gather(logprobs, 1, ids)


def entropy_step(logits: torch.Tensor, temperatures: torch.Tensor, config: EntropyConfig) -> list[float]:
    return entropy_for_sampling(logits, temperatures, config).tolist()


def time_ms(fn, *args) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def measure(bs: int, vocab: int, dtype: torch.dtype, top_k: int, repeats: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(bs, vocab, device="cuda", generator=gen) * 3).to(dtype)
    temperatures = torch.full((bs, 1), 0.7, device="cuda")
    config = EntropyConfig(top_k=top_k)
    for _ in range(5):  # warm-up: kernels, allocator
        sampler_step(logits, temperatures)
        entropy_step(logits, temperatures, config)
    sampler, entropy = [], []
    for i in range(repeats):
        pair = [("s", sampler_step, (logits, temperatures)), ("e", entropy_step, (logits, temperatures, config))]
        for name, fn, args in pair if i % 2 == 0 else reversed(pair):
            (sampler if name == "s" else entropy).append(time_ms(fn, *args))
    ratios = [e / s for e, s in zip(entropy, sampler, strict=True)]
    return {
        "bs": bs,
        "vocab": vocab,
        "dtype": str(dtype).removeprefix("torch."),
        "top_k": top_k,
        "sampler_ms": statistics.median(sampler),
        "entropy_ms": statistics.median(entropy),
        "ratio": statistics.median(ratios),
        "ratio_ci95": median_ci95(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "entropy_op_gpu.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    rows = []
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(
        f"{'vocab':>7s} {'dtype':>9s} {'top_k':>5s} {'bs':>4s} {'sampler ms':>10s} {'entropy ms':>10s} {'ratio':>7s} CI95"
    )
    for vocab in VOCABS.values():
        for dtype in (torch.bfloat16, torch.float32):
            for top_k in (0, 20):
                for bs in args.batch_sizes:
                    r = measure(bs, vocab, dtype, top_k, args.repeats)
                    rows.append(r)
                    lo, hi = r["ratio_ci95"]
                    print(
                        f"{vocab:7d} {r['dtype']:>9s} {top_k:5d} {bs:4d} {r['sampler_ms']:10.4f} "
                        f"{r['entropy_ms']:10.4f} {r['ratio']:7.3f} [{lo:.3f}, {hi:.3f}]",
                        flush=True,
                    )
    report = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
