# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Accuracy of the forecast's two ways to take ⟨X_b, Δθ⟩ against the exact float32 value, per prompt.

The model is wrapped by torch's FSDP2 (one gloo rank, CPU) with ``--precision fp32`` or ``bf16`` compute
(``MixedPrecisionPolicy(param_dtype=...)``, verl's GPU default is bf16), trained a few AdamW steps on random
policy-gradient batches (``--warm``; 0 = the optimizer's first step), then one more step Δθ. On E (``--prompts`` ×
``--G`` responses of ``--response-length`` tokens sampled from the model) it prints per prompt and estimator:

- ``exact``: ⟨X_b, Δθ⟩ from the probe's backward passes (``ProbeComponents.accumulate_sum_X``) on a plain float32
  copy of the model at θ (independent of the forecast's code);
- ``central_difference``: ``directional.x_directional_derivatives`` from forwards at θ′, θ and θ − Δθ;
- ``backward``: ``directional.x_directional_derivatives_by_backward`` on the FSDP2 model.

    python treetune_tests/treetune_verl/forecast/bench_directional_accuracy.py --precision fp32
    python treetune_tests/treetune_verl/forecast/bench_directional_accuracy.py --precision bf16
    python treetune_tests/treetune_verl/forecast/bench_directional_accuracy.py --model tiny --lr 1e-4 --warm 0 \
        --response-length 64
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from treetune_verl.forecast.directional import (  # noqa: E402
    token_values,
    x_directional_derivatives,
    x_directional_derivatives_by_backward,
)
from treetune_verl.forecast.live import sample_eval_batch  # noqa: E402
from treetune_verl.forecast.settings import ForecastSettings  # noqa: E402
from treetune_verl.forecast.sharding import reshard  # noqa: E402
from treetune_verl.forecast.step_weights import WeightsAroundStep  # noqa: E402
from treetune_verl.probe.components import ProbeComponents  # noqa: E402


def _model(name: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    if name == "tiny":
        from treetune_tests.tiny_model import build_tiny_qwen2
        from treetune_verl.model_cache import models_dir

        path = build_tiny_qwen2(models_dir() / "tiny-qwen2-seed0", seed=0)
    else:
        from treetune_verl.model_cache import smollm2_path

        path = smollm2_path()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--warm", type=int, default=3, help="AdamW steps before the measured one")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--G", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "directional_accuracy.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("gloo", init_method=f"file://{Path(tempfile.mkdtemp()) / 'store'}", rank=0, world_size=1)
    model = _model(args.model)
    reference = copy.deepcopy(model)
    param_dtype = torch.bfloat16 if args.precision == "bf16" else None
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    V, P, R, B, G = model.config.vocab_size, args.prompt_length, args.response_length, args.prompts, args.G

    def policy_gradient_step() -> None:
        ids = torch.randint(2, V, (B * G, P + R), generator=gen)
        logits = model(input_ids=ids).logits[:, P - 1 : -1].float()
        logprobs = logits.log_softmax(-1).gather(-1, ids[:, P:, None]).squeeze(-1)
        (-(torch.randn(B * G, 1, generator=gen) * logprobs).mean()).backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(args.warm):
        policy_gradient_step()
    prompts = [torch.randint(2, V, (P,), generator=gen).tolist() for _ in range(B)]
    E = sample_eval_batch(model, prompts, G, R, 1.0, 0, [0], 5)
    settings = ForecastSettings(probe={"estimator": {"baseline": {"mode": "none"}}})  # stateless: three fresh copies
    reshard(model)  # the sharded parameters, not the gathered copies of the root

    def components(m: torch.nn.Module) -> dict[str, ProbeComponents]:
        return {e: ProbeComponents(m, settings.probe_config(e, 1.0), optimizer) for e in settings.estimators}

    for_central, for_backward = components(model), components(model)  # built while the parameters are sharded
    first = next(iter(for_central.values()))
    weights = WeightsAroundStep(first)
    theta = {name: t.clone() for name, t in weights.saved.items()}
    policy_gradient_step()
    plus = token_values(first, E, B)
    step_norm = weights.swap() ** 0.5
    at_theta = token_values(first, E, B)
    by_backward, _ = x_directional_derivatives_by_backward(for_backward, E, weights.step)
    weights.minus_step()
    minus = token_values(first, E, B)
    step = {name: weights.saved[name].double() - theta[name].double() for name in theta}
    weights.restore()
    central = x_directional_derivatives(for_central, E, at_theta, plus, minus)

    reference.load_state_dict(theta, strict=False)
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "step_norm": step_norm, "estimators": {}}
    for estimator in settings.estimators:
        comps = ProbeComponents(reference, settings.probe_config(estimator, 1.0))
        exact = []
        for b in range(B):
            buffer, _ = comps.accumulate_sum_X({k: v[b : b + 1] for k, v in E.items()}, 1)
            exact.append(ProbeComponents.dot_param_buffers({n: buffer[n].double() for n in step}, step))
        rows = {
            "exact": exact,
            "central_difference": central[estimator].tolist(),
            "backward": by_backward[estimator].tolist(),
        }
        result["estimators"][estimator] = rows
        for method, values in rows.items():
            mean = sum(values) / len(values)
            print(f"{estimator:12s} {method:18s} mean {mean:+.5f}  per prompt " + " ".join(f"{v:+.5f}" for v in values))
    print(f"precision {args.precision}, step norm {step_norm:.3g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
