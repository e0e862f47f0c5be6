# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Cost of the live forecast against the actor update it forecasts on verl 0.9.1, side by side on the same shape.

verl 0.9.1's real ``ActorRolloutRefWorker`` (role ``actor``, built by its own ``init_model``: ``FSDPEngineWithLMHead``,
FSDP2 in float32, one gloo rank, AdamW, clipping) with the CPU runtime patches (this script re-executes itself with
their environment, ``engine_actor.CPU_RUNTIME``). Batches are laid out as the V1 trainer hands them to
``update_actor`` (``engine_actor.update_batch``: ``--prompts`` prompts x ``--n`` responses of ``--response-length``
tokens, random ids; the cost does not depend on them). Each round trains on two fresh batches, one with verl's plain
``update_actor`` (arm ``update``: the seam's original) and one through our seam with E from the rollout in the
batch, as our V1 ``_update_actor`` seam puts it (arm ``forecast``: ``--eval-share`` of the prompts, ``--n`` responses
each, every response the whole budget long: the most a forward over E costs), in an order alternating ABBA across
rounds. Reported, as the median over rounds with a distribution-free 95 % CI (>= 6 rounds):

- ``ratio_vs_update``: the forecast's own seconds in the actor (``timing_s/probe``) over the plain update's seconds of
  the same round: issue 28's acceptance figure (goal <= 0.5);
- ``ratio_in_call``: ``timing_s/probe`` over the update inside the same forecast call (``probe/update_s``).

verl 0.7.1's bench is ``forecast/bench_forecast_cost.py`` (its ``DataParallelPPOActor``). Writes JSON (``--out``).

    python treetune_tests/treetune_verl/verl/v0_9_1/bench_forecast_cost_v0_9_1.py --model smollm2 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO_ROOT))

from treetune_tests.treetune_verl.verl.v0_9_1.engine_actor import (  # noqa: E402
    CPU_RUNTIME,
    actor_config,
    join_process_group,
    update_batch,
)

MEASURED = ("timing_s/probe", "probe/update_s", "probe/sample_s")


def _model_path(name: str) -> str:
    if name == "tiny":
        from treetune_tests.tiny_model import build_tiny_qwen2
        from treetune_verl.model_cache import models_dir

        return str(build_tiny_qwen2(models_dir() / "tiny-qwen2-seed0", seed=0))
    from treetune_verl.model_cache import smollm2_path

    return str(smollm2_path())


def _rows(args: argparse.Namespace, vocab: int, seed: int):
    """``--prompts`` x ``--n`` rows of the full lengths: prompts, responses, advantages (+-1 alternating), uids."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (args.prompts, args.prompt_length), generator=gen).repeat_interleave(args.n, 0)
    rows = args.prompts * args.n
    responses = [torch.randint(3, vocab, (args.response_length,), generator=gen) for _ in range(rows)]
    advantages = [torch.full((args.response_length,), 1.0 if k % 2 == 0 else -1.0) for k in range(rows)]
    return list(prompts), responses, advantages, [f"p{seed}-{k // args.n}" for k in range(rows)]


def _rollout_eval(prompts, uids, settings, args: argparse.Namespace, vocab: int, seed: int):
    """E as our V1 trainer seam hands it to the actor: E's share of the prompts, ``--n`` full-budget responses each."""
    from treetune_tests.treetune_verl.forecast.given_eval import given_eval

    E_uids = settings.eval_uids(uids)
    E_prompts = [prompts[uids.index(uid)] for uid in E_uids]
    return given_eval(E_uids, E_prompts, args.n, vocab, args.response_length, seed + 500_000, full_budget=True, low=3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=48)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as verl's Ray workers run)")
    parser.add_argument("--eval-share", type=float, default=0.5, help="E's share of the batch's prompts")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "forecast_cost_v0_9_1.json")
    args = parser.parse_args(argv)

    if any(os.environ.get(key) != value for key, value in CPU_RUNTIME.items()):
        # verl's CPU runtime patches are installed at interpreter start (tools/cpu_shims/verl_cpu)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **CPU_RUNTIME})

    import statistics

    import torch
    from omegaconf import open_dict
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker

    import treetune_verl.verl.process_setup  # noqa: F401  (external_lib: installs the actor seam)
    from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95
    from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY
    from treetune_verl.forecast.settings import forecast_settings
    from treetune_verl.patching import original_of

    torch.set_num_threads(args.threads)
    join_process_group(0, 1, _free_port())
    rows = args.prompts * args.n
    config = actor_config(
        _model_path(args.model),
        args.prompt_length,
        args.response_length,
        rows,
        args.n,
        micro_rows=rows,
        lr=1e-6,
        clip_grad=1.0,
    )
    with open_dict(config):
        config.actor_rollout_ref.rollout.custom = {"entropy_forecast": {"every": 1, "eval_share": args.eval_share}}
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    settings = forecast_settings(worker.config.rollout)
    vocab = worker.actor.model_config.hf_config.vocab_size
    plain_update = original_of(ActorRolloutRefWorker.update_actor)

    def batch(seed: int, with_eval: bool):
        prompts, responses, advantages, uids = _rows(args, vocab, seed)
        data = update_batch(worker, prompts, responses, advantages, uids, rows_per_mini_batch=rows)
        if with_eval:  # as verl's transferqueue_utils turns the trainer's extra_info into fields
            E = _rollout_eval(prompts, uids, settings, args, vocab, seed)
            tu.assign_non_tensor_data(data, FORECAST_EVAL_META_KEY, E)
        return data

    plain_update(worker, batch(10_000, with_eval=False))  # warm-up (AdamW state, allocator)
    records: list[dict[str, float]] = []
    for r in range(args.rounds):
        order = ("update", "forecast") if r % 4 in (0, 3) else ("forecast", "update")
        record: dict[str, float] = {}
        for arm in order:
            data = batch(2 * r + (arm == "forecast"), with_eval=arm == "forecast")
            if arm == "update":
                start = time.perf_counter()
                plain_update(worker, data)
                record["update_s"] = time.perf_counter() - start
            else:
                metrics = tu.get(worker.update_actor(data), "metrics")
                record.update({key: float(metrics[key]) for key in MEASURED})
        record["ratio_vs_update"] = record["timing_s/probe"] / record["update_s"]
        record["ratio_in_call"] = record["timing_s/probe"] / record["probe/update_s"]
        records.append(record)
        print(json.dumps({"round": r, **{k: round(v, 4) for k, v in record.items()}}), flush=True)
        summary = {}
        for key in ("ratio_vs_update", "ratio_in_call", "update_s", *MEASURED):
            values = [record[key] for record in records]
            summary[key] = {"median": statistics.median(values), "ci95": list(median_ci95(values))}
        result = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": platform.platform(),
            "verl": "0.9.1",
            "goal": "ratio_vs_update <= 0.5",
            "summary": summary,
            "rounds": records,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))  # after every round: an interrupted run keeps its rounds
    torch.distributed.destroy_process_group()
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
