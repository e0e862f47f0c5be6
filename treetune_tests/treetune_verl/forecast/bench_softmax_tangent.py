# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""How far first order goes as a policy collapses: ΔH₁ and the forecast exact in the softmax against the exact change.

SmolLM2-135M (float32, CPU) trained on its own samples (loss −mean log π of the responses it just sampled: entropy
collapses within ~10 steps), AdamW ``--lr`` warmed up linearly over ``--warmup`` steps, ``--prompts`` chat prompts ×
``--G`` responses of up to ``--width`` tokens per step. At every step, on that step's responses (E) and the step's
Δθ, per token of E:

- ``exact``: H(θ + Δθ) − H(θ), plain HF forwards and ``torch.log_softmax`` written here;
- ``first_order``: (H(θ + Δθ) − H(θ − Δθ)) / 2, ΔH₁ as the live forecast takes it;
- ``softmax``: ``softmax_tangent.SoftmaxTangent`` on the same three forwards' log-probabilities.

Prints each step and, over the steps, Pearson against the exact change and the median absolute and relative errors;
``--out`` writes them as JSON (``treetune_specs/figures/bench_softmax_tangent_2026-11-28.json``).

    python treetune_tests/treetune_verl/forecast/bench_softmax_tangent.py --steps 30 \\
        --out treetune_specs/figures/bench_softmax_tangent_2026-11-28.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from treetune_verl.forecast.softmax_tangent import SoftmaxTangent  # noqa: E402
from treetune_verl.model_cache import smollm2_path  # noqa: E402

QUESTIONS = ("What is 12 plus 7?", "Name a color of the sky.", "Write one word about cats.", "How many legs has a dog?")


def sampled_batch(model, tokenizer, prompts: list[list[int]], G: int, width: int):
    """``(ids [N, T], attention [N, T], targets [N, T] bool)``: G responses per prompt, the positions predicting them."""
    rows = []
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt] * G)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                max_new_tokens=width,
                pad_token_id=eos,
            )
            for response in out[:, len(prompt) :].tolist():
                length = next((i + 1 for i, t in enumerate(response) if t == eos), len(response))
                rows.append((prompt, response[:length]))
    T = max(len(p) + len(r) for p, r in rows)
    ids, attention = torch.full((len(rows), T), eos), torch.zeros(len(rows), T, dtype=torch.long)
    targets = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (prompt, response) in enumerate(rows):
        sequence = prompt + response
        ids[i, : len(sequence)], attention[i, : len(sequence)] = torch.tensor(sequence), 1
        targets[i, len(prompt) - 1 : len(sequence) - 1] = True
    return ids, attention, targets


@torch.no_grad()
def log_probs(model, ids, attention, targets) -> torch.Tensor:
    """``[T, V]`` float32 log-probabilities at E's response positions."""
    return torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits[targets].float(), dim=-1)


def entropy(log_p: torch.Tensor) -> torch.Tensor:
    log_p = log_p.double()
    return -(log_p.exp() * log_p).sum(-1)


def pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return sxy / math.sqrt(sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--G", type=int, default=2)
    parser.add_argument("--width", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True) for q in QUESTIONS
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, k / args.warmup))
    params = list(model.parameters())
    steps = []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        ids, attention, targets = sampled_batch(model, tokenizer, prompts, args.G, args.width)
        theta = [p.detach().clone() for p in params]
        at_theta = log_probs(model, ids, attention, targets)
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
        token_lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(token_lp * targets[:, :-1]).sum() / targets.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        plus = log_probs(model, ids, attention, targets)
        with torch.no_grad():
            for p, t in zip(params, theta, strict=True):
                p.copy_(2 * t - p)  # θ − Δθ
        minus = log_probs(model, ids, attention, targets)
        with torch.no_grad():
            for p, t in zip(params, theta, strict=True):
                p.copy_(2 * t - p)  # θ′ again
        h0, h_plus, h_minus = entropy(at_theta), entropy(plus), entropy(minus)
        tangent = SoftmaxTangent(plus.clone())
        tangent.add_theta(at_theta)
        row = {
            "step": step,
            "tokens": int(targets.sum()),
            "H": float(h0.mean()),
            "exact": float((h_plus - h0).mean()),
            "first_order": float(((h_plus - h_minus) / 2).mean()),
            "softmax": float(tangent.changes(minus).mean()),
        }
        steps.append(row)
        print(
            json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()}),
            f"{time.perf_counter() - start:.1f} s",
            flush=True,
        )
    moved = [s for s in steps if s["exact"] != 0.0]  # warm-up's first step: lr 0
    exact = [s["exact"] for s in moved]
    summary = {}
    for name in ("first_order", "softmax"):
        forecast = [s[name] for s in moved]
        summary[name] = {
            "pearson": pearson(forecast, exact),
            "median_abs_error": statistics.median(abs(f - e) for f, e in zip(forecast, exact, strict=True)),
            "median_relative_error": statistics.median(
                abs(f - e) / abs(e) for f, e in zip(forecast, exact, strict=True) if abs(e) > 1e-3
            ),
        }
        print(name, {k: round(v, 4) for k, v in summary[name].items()})
    if args.out:
        args.out.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "steps": steps}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
