# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Cost of the live entropy forecast against the actor update it forecasts, side by side on the same tokens.

verl 0.7.1's real ``DataParallelPPOActor`` on an FSDP2-wrapped model (one gloo rank, CPU), AdamW, batches shaped
like the e2e run's (``--prompts`` prompts x ``--n`` responses of ``--response-length`` tokens, random token ids; the
cost does not depend on the ids). Each round trains on two fresh batches of the same shape, one with plain
``update_policy`` (arm ``update``) and one through ``ForecastRun.around`` (arm ``forecast``), in an order that alternates
ABBA across rounds so that a drift of the shared machine hits both arms alike. Reported:

- ``ratio_vs_update``: the forecast's own seconds in the actor (``timing_s/probe``: the three forwards over E, the
  weight swaps, the estimators' surrogates, and with ``--eval-source actor`` sampling E there too) over the plain
  update's seconds of the same round: the acceptance figure (goal <= 0.5 with E from the rollout, issue 28);
- ``ratio_in_call``: ``timing_s/probe`` over the update inside the same forecast call (``probe/update_s``);

each as the median over rounds with a distribution-free 95 % CI (order statistics; >= 6 rounds), and the phase
seconds. Writes JSON (``--out``).

``--eval-source rollout`` (default): E is handed to the actor as our manager does (``meta_info`` of the batch, an
``EvalResponses`` of ``--n`` responses for each of ``--eval-share`` of the prompts, the forecast's ``eval_share``,
default 0.5; every response the whole budget long: the most a forward over E can cost); its sampling is the rollout's (``bench_forecast_rollout_share.py``). ``actor``: E sampled in the actor
with HF-style decoding, the forecast's fallback without our manager (and the first version's cost).

    python treetune_tests/treetune_verl/forecast/bench_forecast_cost.py --model smollm2 --rounds 6 --prompts 2 \
        --prompt-length 32 --response-length 32 [--estimators rb_residual] [--eval-source actor]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import functools
import json
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from treetune_tests.treetune_verl.forecast.given_eval import given_eval  # noqa: E402
from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95  # noqa: E402
from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY  # noqa: E402
from treetune_verl.forecast.live import ForecastRun, ForecastState  # noqa: E402
from treetune_verl.forecast.rollout_eval import EvalResponses  # noqa: E402
from treetune_verl.forecast.settings import ForecastSettings  # noqa: E402


def _model(name: str) -> tuple[torch.nn.Module, int]:
    from transformers import AutoModelForCausalLM

    if name == "tiny":
        from treetune_tests.tiny_model import build_tiny_qwen2
        from treetune_verl.model_cache import models_dir

        path = build_tiny_qwen2(models_dir() / "tiny-qwen2-seed0", seed=0)
    else:
        from treetune_verl.model_cache import smollm2_path

        path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    return model.train(), int(model.config.vocab_size)


def fsdp2_actor(model_name: str, rows: int, n: int):
    """verl 0.7.1's ``DataParallelPPOActor`` on ``model_name`` wrapped in FSDP2 (one gloo rank joined here, CPU,
    float32, padded layout), one mini- and micro-batch of ``rows`` rows, AdamW at lr 1e-6; and the vocabulary size."""
    from torch.distributed.fsdp import fully_shard
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config import FSDPActorConfig, FSDPEngineConfig

    store = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=0, world_size=1, timeout=datetime.timedelta(600)
    )
    model, vocab = _model(model_name)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    config = FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=rows,
        ppo_micro_batch_size_per_gpu=rows,
        rollout_n=n,
        use_torch_compile=False,
        use_remove_padding=False,
        fsdp_config=FSDPEngineConfig(dtype="float32"),
    )
    return DataParallelPPOActor(config, model, torch.optim.AdamW(model.parameters(), lr=1e-6)), vocab


def _batch(vocab: int, prompts: int, n: int, prompt_len: int, response_len: int, seed: int):
    from verl import DataProto

    gen = torch.Generator().manual_seed(seed)
    rows = prompts * n
    prompt = torch.randint(3, vocab, (prompts, prompt_len), generator=gen).repeat_interleave(n, dim=0)
    responses = torch.randint(3, vocab, (rows, response_len), generator=gen)
    mask = torch.ones(rows, response_len, dtype=torch.int64)
    attention = torch.ones(rows, prompt_len + response_len, dtype=torch.int64)
    advantages = torch.tensor([1.0, -1.0]).repeat(rows // 2)[:, None] * mask
    tensors = {
        "input_ids": torch.cat([prompt, responses], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": mask,
        "advantages": advantages.float(),
        "old_log_probs": torch.zeros(rows, response_len),
    }
    uid = np.array([f"p{seed}-{k // n}" for k in range(rows)], dtype=object)
    return DataProto.from_dict(tensors, non_tensors={"uid": uid}, meta_info={"temperature": 1.0, "pad_token_id": 0})


def _rollout_eval(data, settings: ForecastSettings, vocab: int, n: int, response_len: int, seed: int) -> EvalResponses:
    """E as our manager hands it over: E's share of the batch's prompts, ``n`` fresh responses each of the whole
    budget."""
    uids = settings.eval_uids(list(data.non_tensor_batch["uid"]))
    first = [list(data.non_tensor_batch["uid"]).index(uid) for uid in uids]
    prompt_len = data.batch["input_ids"].shape[1] - response_len
    prompts = [data.batch["input_ids"][i, :prompt_len] for i in first]
    return given_eval(uids, prompts, n, vocab, response_len, seed + 500_000, full_budget=True, low=3)


def _write(args: argparse.Namespace, rounds: list[dict[str, float]]) -> dict:
    summary = {}
    for key in ("ratio_vs_update", "ratio_in_call", "update_s", "timing_s/probe", "probe/update_s", "probe/sample_s"):
        values = [record[key] for record in rounds]
        low, high = median_ci95(values)
        summary[key] = {"median": statistics.median(values), "ci95": [low, high]}
    result = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": platform.platform(),
        "goal": "ratio_vs_update <= 0.5" if args.eval_source == "rollout" else "ratio_vs_update <= 2.5",
        "summary": summary,
        "rounds": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=48)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as verl's Ray workers run)")
    parser.add_argument("--estimators", nargs="+", default=["naive", "rb_residual"], help="the block's estimators")
    parser.add_argument("--profile", action="store_true", help="cProfile the last round's forecast call, print it")
    parser.add_argument("--eval-share", type=float, default=0.5, help="E's share of the batch's prompts")
    parser.add_argument("--eval-source", choices=["rollout", "actor"], default="rollout", help="where E comes from")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "forecast_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    actor, vocab = fsdp2_actor(args.model, args.prompts * args.n, args.n)
    settings = ForecastSettings(estimators=tuple(args.estimators), eval_share=args.eval_share)
    state = ForecastState()
    shape = (vocab, args.prompts, args.n, args.prompt_length, args.response_length)
    actor.update_policy(_batch(*shape, seed=10_000))  # warm-up (AdamW state, allocator)
    rounds = []
    for r in range(args.rounds):
        order = ("update", "forecast") if r % 4 in (0, 3) else ("forecast", "update")
        record: dict[str, float] = {}
        for arm in order:
            data = _batch(*shape, seed=2 * r + (arm == "forecast"))
            if arm == "update":
                start = time.perf_counter()
                actor.update_policy(data)
                record["update_s"] = time.perf_counter() - start
            else:
                if args.eval_source == "rollout":
                    data.meta_info[FORECAST_EVAL_META_KEY] = _rollout_eval(
                        data, settings, vocab, args.n, args.response_length, r
                    )
                update = functools.partial(type(actor).update_policy, actor, data)
                profile = cProfile.Profile() if args.profile and r == args.rounds - 1 else None
                with profile or contextlib.nullcontext():
                    _, metrics = ForecastRun.from_dp_actor(actor, data, settings, state, args.n, [0]).around(update)
                record.update(
                    {
                        k: float(v)
                        for k, v in metrics.items()
                        if k in ("timing_s/probe", "probe/update_s", "probe/sample_s")
                    }
                )
        record["ratio_vs_update"] = record["timing_s/probe"] / record["update_s"]
        record["ratio_in_call"] = record["timing_s/probe"] / record["probe/update_s"]
        rounds.append(record)
        print(json.dumps({"round": r, **{k: round(v, 4) for k, v in record.items()}}), flush=True)
        summary = _write(args, rounds)  # after every round: an interrupted run keeps what it measured
    dist.destroy_process_group()
    print(json.dumps(summary, indent=1))
    if args.profile:  # where the last forecast call's seconds went: verl's update, E's forwards, the weight copies
        pstats.Stats(profile).sort_stats("cumulative").print_stats(r"step_weights|token_values|update_policy|backward")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
