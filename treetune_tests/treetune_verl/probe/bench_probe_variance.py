# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Where the spread of ΔH₁ comes from, per X estimator, on SmolLM2 (CPU). A script, not a test.

    python treetune_tests/treetune_verl/probe/bench_probe_variance.py [--batches 16] [--B 4] [--G 8] [--json PATH]

ΔH₁ = ⟨X̄, Δθ⟩ and every X estimator is a combination of ∇log π(y_j|s_j) and ∇H_k with detached coefficients, so
its projection on a fixed direction d needs only the directional derivatives D log π(y_j|s_j) = ⟨∇log π, d⟩ and
D H_k per token. They are taken here by central finite differences of teacher-forced forwards at θ ± ε·d (forwards
only, ε·d on the weights, restored bit-exactly), for every sampled token at once; each estimator's projection is then
re-evaluated from the same tokens. Check: the naive and RB projections of the first E batch are compared with the
probe's own autograd ⟨X̄, d⟩ (``estimate_mean_X``), printed as relative errors.

Directions d: the main job's step (AdamW as verl's actor, state warmed up by ``optimizer.state_warmup_batches``
real steps; Δθ = its next step from −Ȳ on U) and the previous default's (SGD lr 1e-5, Δθ = lr·Ȳ).

Per prompt, the G responses are split into two disjoint halves of G/2, each giving an estimate at group size G/2
(a, b). Over prompts: within-prompt variance (sampling the responses) = mean (a − b)²/2, between-prompt variance
(which prompts E holds; no per-response estimator can remove it) = sample Cov(a, b). The spread of a B_E-prompt batch
is √((within + between)/B_E). Estimators (all unbiased for ⟨∇H̄, d⟩):
- ``naive``: −mean_g (S_g/L_max − LOO)·D S_g.
- ``rb[none]`` / ``rb[residual_mu]`` / ``rb[loo]``: mean_g [Σ_j (R_j − μ_j)·D log π_j + Σ_k D H_k]/L_max with
  R_j = Σ_{k>j} H_k and μ = 0, the per-position running mean of previous batches (the probe's ``ResidualBaseline``),
  or the per-prompt per-position leave-one-out mean of R_j over the other responses of the half.
  ``rb_score[...]`` and ``rb_path`` are the two terms alone.
Writes JSON (per-prompt values included) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from treetune_tests.treetune_verl.probe.bench_probe import stopwatch  # noqa: E402
from treetune_verl.forecast.directional import token_values  # noqa: E402
from treetune_verl.probe.components import ProbeComponents  # noqa: E402
from treetune_verl.probe.config import resolve_config  # noqa: E402
from treetune_verl.probe.estimators import ResidualBaseline  # noqa: E402
from treetune_verl.probe.mixed_probe import estimate_mean_X, estimate_mean_Y, resolve_lr  # noqa: E402
from treetune_verl.probe.model_loading import load_model_and_tokenizer  # noqa: E402
from treetune_verl.probe.optimizers import build_optimizer, warm_up_optimizer_state  # noqa: E402
from treetune_verl.probe.task_sampler import ArithmeticBatchSampler  # noqa: E402

ParamBuffer = dict[str, torch.Tensor]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=16, help="E batches")
    parser.add_argument("--B", type=int, default=4, help="prompts per E and U batch")
    parser.add_argument("--G", type=int, default=8, help="responses per prompt (split into two halves)")
    parser.add_argument("--mb", type=int, default=2, help="prompts per microbatch")
    parser.add_argument("--eps", type=float, default=1.0, help="finite-difference step, in units of Δθ")
    parser.add_argument("--sgd-lr", type=float, default=1e-5, help="lr of the previous default's SGD direction")
    parser.add_argument("--no-sgd", action="store_true", help="only the main job's (AdamW) direction")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="outputs/bench_probe_variance.json")
    return parser.parse_args(argv)


def token_stats(comps: ProbeComponents, batch: dict[str, torch.Tensor], mb: int) -> tuple[torch.Tensor, ...]:
    """``(log π [B, G, R], H [B, G, R], mask [B, G, R])`` in fp64 under the current weights, no gradient."""
    values = token_values(comps, batch, mb)  # the live forecast's forwards
    return values.token_logprobs, values.entropies, values.response_mask


@torch.no_grad()
def shift_weights(comps: ProbeComponents, direction: ParamBuffer, scale: float) -> None:
    for name, p in comps.named_params:
        p.add_(direction[name].to(p.device, p.dtype), alpha=scale)


def directional_derivatives(
    comps: ProbeComponents, batches: list[dict], direction: ParamBuffer, eps: float, mb: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per batch ``(D log π, D H)`` ``[B, G, R]`` along ``direction`` by central differences at θ ± eps·d."""
    saved = [p.detach().clone() for p in comps.params]
    plus, minus = [], []
    try:
        shift_weights(comps, direction, eps)
        plus = [token_stats(comps, batch, mb) for batch in batches]
        with torch.no_grad():
            for p, s in zip(comps.params, saved, strict=True):
                p.copy_(s)
        shift_weights(comps, direction, -eps)
        minus = [token_stats(comps, batch, mb) for batch in batches]
    finally:
        with torch.no_grad():
            for p, s in zip(comps.params, saved, strict=True):
                p.copy_(s)
    return [((a[0] - b[0]) / (2 * eps), (a[1] - b[1]) / (2 * eps)) for a, b in zip(plus, minus, strict=True)]


def loo_mean(values: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Per prompt, per position: mean of ``values [b, g, R]`` over the OTHER responses present there (0 if none)."""
    v = values.masked_fill(~present, 0.0)
    n = present.double().sum(dim=1, keepdim=True) - present.double()
    return torch.where(n > 0, (v.sum(dim=1, keepdim=True) - v) / n.clamp(min=1), 0.0)


def per_prompt_projections(
    lp: torch.Tensor,
    H: torch.Tensor,
    mask: torch.Tensor,
    Dlp: torch.Tensor,
    DH: torch.Tensor,
    lmax: torch.Tensor,
    mu: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Each estimator's per-prompt ⟨X_b, d⟩ ``[b]`` from the responses given (one half), μ ``[R]`` the running mean."""
    lmax = lmax.double().view(-1, 1)
    Dlp, DH = Dlp.masked_fill(~mask, 0.0), DH.masked_fill(~mask, 0.0)
    S, DS = lp.sum(-1), Dlp.sum(-1)
    G = S.shape[1]
    S_w = S / lmax
    naive = -((S_w - (S_w.sum(1, keepdim=True) - S_w) / (G - 1)) * DS).mean(1)
    residual = (H.flip(-1).cumsum(-1).flip(-1) - H).masked_fill(~mask, 0.0)  # R_j = Σ_{k>j} H_k
    path = DH.sum(-1).mean(1) / lmax.squeeze(1)
    out = {"naive": naive, "rb_path": path}
    baselines = {"none": torch.zeros_like(residual), "residual_mu": mu.view(1, 1, -1).expand_as(residual)}
    baselines["loo"] = loo_mean(residual, mask)
    for name, b in baselines.items():
        score = (((residual - b) * Dlp).masked_fill(~mask, 0.0).sum(-1)).mean(1) / lmax.squeeze(1)
        out[f"rb_score[{name}]"] = score
        out[f"rb[{name}]"] = score + path
    return out


def variance_table(halves: dict[str, list[tuple[float, float]]], B: int) -> dict[str, dict[str, float]]:
    """Per estimator: within- and between-prompt variance of a G/2 estimate, the B-prompt std, and the mean."""
    table = {}
    for name, pairs in halves.items():
        a = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
        b = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
        within = float(((a - b) ** 2).mean() / 2)
        between = float(((a - a.mean()) * (b - b.mean())).sum() / (len(a) - 1))
        table[name] = {
            "mean": float(torch.cat([a, b]).mean()),
            "within_var": within,
            "between_var": between,
            "std_of_B_prompt_batch": max(within + between, 0.0) ** 0.5 / B**0.5,
            "within_share": within / (within + between) if within + between > 0 else float("nan"),
        }
    return table


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.G < 4 or args.G % 2:
        raise SystemExit("--G must be even and >= 4 (two halves of >= 2 responses for the naive LOO)")
    torch.manual_seed(args.seed)
    wall = time.perf_counter()
    cfg = resolve_config(
        {
            "batch": {"B_E": args.B, "B_U": args.B, "G": args.G},
            "probe": {"mb_size_prompts": args.mb},
            "run": {"seed": args.seed},
        }
    )
    model, tokenizer, model_name = load_model_and_tokenizer(cfg.model)
    device = next(model.parameters()).device
    optimizer = build_optimizer(cfg.optimizer, [p for p in model.parameters() if p.requires_grad])
    lr = resolve_lr(cfg, optimizer)
    comps = ProbeComponents(model, cfg, optimizer)
    sampler = ArithmeticBatchSampler(model, tokenizer, cfg, args.seed)
    times: dict[str, float] = {}
    with stopwatch(device, times, "warm_up_s"):
        warm_up_optimizer_state(
            comps,
            (sampler.sample(args.B)[0] for _ in range(int(cfg.optimizer.state_warmup_batches))),
            args.mb,
            optimizer,
        )
    U, _ = sampler.sample(args.B)
    adamw = estimate_mean_Y(comps, U, args.mb, optimizer)
    label = f"{type(optimizer).__name__} lr {lr:g} (warmed {cfg.optimizer.state_warmup_batches})"
    directions = {label: ProbeComponents.scale_buffer(adamw.buffer, lr)}
    if not args.no_sgd:
        sgd = estimate_mean_Y(comps, U, args.mb, None)
        directions[f"SGD lr {args.sgd_lr:g}"] = ProbeComponents.scale_buffer(sgd.buffer, args.sgd_lr)
    with stopwatch(device, times, "sample_E_s"):
        batches = [sampler.sample(args.B)[0] for _ in range(args.batches)]
    with stopwatch(device, times, "base_forward_s"):
        base = [token_stats(comps, batch, args.mb) for batch in batches]

    # The probe's own autograd projections of the first batch, to check the finite differences against.
    check_cfgs = {
        "naive": {"estimator": {"x_estimator_mode": "naive"}},
        "rb[none]": {"estimator": {"x_estimator_mode": "rb_residual", "baseline": {"mode": "none"}}},
    }
    autograd = {}
    for name, extra in check_cfgs.items():
        c = ProbeComponents(model, OmegaConf.merge(cfg, extra), optimizer)
        autograd[name] = estimate_mean_X(c, batches[0], args.mb)[0]

    results: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": model_name,
        "device": str(device),
        "args": vars(args),
        "optimizer": OmegaConf.to_container(cfg.optimizer) | {"class": type(optimizer).__name__},
        "directions": {},
    }
    for label, direction in directions.items():
        start = time.perf_counter()
        derivs = directional_derivatives(comps, batches, direction, args.eps, args.mb)
        halves: dict[str, list[tuple[float, float]]] = {}
        full_first: dict[str, float] = {}
        baseline = ResidualBaseline(float(cfg.estimator.baseline.ema_decay))
        for i, ((lp, H, mask), (Dlp, DH), batch) in enumerate(zip(base, derivs, batches, strict=True)):
            R = lp.shape[-1]
            mu = baseline.vector(R).double()
            lmax = batch["max_lengths"]
            h = args.G // 2
            parts = [
                per_prompt_projections(lp[:, s], H[:, s], mask[:, s], Dlp[:, s], DH[:, s], lmax, mu)
                for s in (slice(0, h), slice(h, args.G))
            ]
            for name in parts[0]:
                for x, y in zip(parts[0][name].tolist(), parts[1][name].tolist(), strict=True):
                    halves.setdefault(name, []).append((x, y))
            if i == 0:
                full = per_prompt_projections(lp, H, mask, Dlp, DH, lmax, mu)
                full_first = {name: float(v.mean()) for name, v in full.items()}
            residual = (H.flip(-1).cumsum(-1).flip(-1) - H).masked_fill(~mask, 0.0)
            baseline.update(residual.sum(dim=(0, 1)), mask.double().sum(dim=(0, 1)))
        check = {}
        for name, buf in autograd.items():
            exact = ProbeComponents.dot_param_buffers(buf, direction)
            check[name] = {
                "autograd": exact,
                "finite_difference": full_first[name],
                "rel_err": abs(full_first[name] - exact) / abs(exact),
            }
        table = variance_table(halves, args.B)
        ratio = {
            name: table["naive"]["std_of_B_prompt_batch"] / table[name]["std_of_B_prompt_batch"]
            for name in table
            if name.startswith("rb[")
        }
        results["directions"][label] = {
            "step_norm": float(sum(t.double().pow(2).sum() for t in direction.values()) ** 0.5),
            "fd_check_first_batch": check,
            "table": table,
            "std_ratio_naive_over": ratio,
            "per_prompt_halves": halves,
            "seconds": time.perf_counter() - start,
        }
        print(f"\n=== direction: {label}  (‖Δθ‖ = {results['directions'][label]['step_norm']:.3e})")
        for name, c in check.items():
            print(
                f"  check {name}: autograd {c['autograd']:+.4e}  finite difference {c['finite_difference']:+.4e}  rel err {c['rel_err']:.1e}"
            )
        print(f"  {'estimator':<22}{'mean':>12}{'within var':>12}{'between var':>13}{'within %':>10}{'std(B_E)':>11}")
        for name, row in table.items():
            print(
                f"  {name:<22}{row['mean']:>+12.3e}{row['within_var']:>12.3e}{row['between_var']:>+13.3e}"
                f"{100 * row['within_share']:>10.1f}{row['std_of_B_prompt_batch']:>11.3e}"
            )
        print("  std ratio naive / " + ", ".join(f"{k}: {v:.2f}" for k, v in ratio.items()))
    results["times_s"] = times
    results["wall_s"] = time.perf_counter() - wall
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(
        f"\nG/2 = {args.G // 2} responses per estimate, {args.batches}x{args.B} prompts; wall {results['wall_s']:.0f}s; JSON: {path}"
    )


if __name__ == "__main__":
    main()
