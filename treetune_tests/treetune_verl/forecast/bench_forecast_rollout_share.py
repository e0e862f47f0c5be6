# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The rollout's cost of sampling the forecast's E: ``generate_sequences`` with and without E, side by side.

Our ``EntropyAgentLoopManager`` in verl 0.7.1's standalone rollout mode on real Ray with a real sglang CPU Engine (the
setup of ``agent_loop/test_entropy_manager_standalone_on_cpu.py``), the live forecast's block on. Each round calls
``generate_sequences`` on the same batch shape twice (``--prompts`` chat prompts x ``--n`` rows, default agent loop),
once with E due (the workers sample ``--n`` more responses per prompt beside the rows) and once without (the manager's
``rollout_eval`` taken away for that call), in ABBA order across rounds. Reported, as medians with a distribution-free
95 % CI: ``gen_ratio`` (the call's seconds with E over without: what ``timing_s/gen`` of a forecast step costs
against a step without), ``extra_share`` (1 - without / with: E's share of a forecast step's ``timing_s/gen``) and
``probe/eval_gen_token_share`` (E's tokens over all the call's response tokens). Writes JSON (``--out``). sglang runs
up to ``--max-running-requests`` requests at once (16: the batch's rows and E's together; the CPU tests' 8 would make
E wait for the rows).

    python treetune_tests/treetune_verl/forecast/bench_forecast_rollout_share.py --model smollm2 --rounds 6

On verl 0.9.1 (the installed verl decides) the same comparison runs on the V1 path (the setup of
``verl/v0_9_1/test_v1_rollout_standalone_on_cpu.py``: verl's standalone servers with our replica, our
``AgentLoopManagerTQ`` and V1 workers, TransferQueue): a call is the trainer's dispatch (prompts registered
``pending``, ``generate_sequences``) until every prompt is ``finished`` in TransferQueue (polled every 50 ms), and the
E metrics come from the trainer seam's ``take_rollout_eval``; ``entropy_single_turn_agent`` rows.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from omegaconf import open_dict  # noqa: E402

from treetune_tests.treetune_verl.agent_loop.standalone import ray_session, standalone_config  # noqa: E402
from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95  # noqa: E402
from treetune_verl.batch_keys import PENDING_METRICS_KEY  # noqa: E402


def _model_path(name: str) -> Path:
    if name == "tiny":
        from treetune_tests.tiny_model import build_tiny_qwen2
        from treetune_verl.model_cache import models_dir

        return build_tiny_qwen2(models_dir() / "tiny-qwen2-seed0", seed=0)
    from treetune_verl.model_cache import smollm2_path

    return smollm2_path()


def _batch(prompts: int, n: int, round_: int):
    from treetune_tests.treetune_verl.agent_loop.fakes import make_batch  # verl 0.7.1 (its interactions)

    plans = [f"write a short poem about the number {round_ * prompts + b}" for b in range(prompts) for _ in range(n)]
    batch = make_batch(plans, None)
    batch.non_tensor_batch["uid"] = np.array([f"r{round_}-p{k // n}" for k in range(len(plans))], dtype=object)
    return batch


def _summary(rounds: list[dict[str, float]]) -> dict:
    summary = {}
    for key in ("gen_ratio", "extra_share", "probe/eval_gen_token_share", "with_s", "without_s", "probe/eval_gen_s"):
        values = [record[key] for record in rounds]
        low, high = median_ci95(values)
        summary[key] = {"median": statistics.median(values), "ci95": [low, high]}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument(
        "--max-running-requests",
        type=int,
        default=16,
        help="sglang's cap on concurrent requests (the CPU tests' 8 would queue E behind the batch's rows)",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "forecast_rollout_share.json")
    args = parser.parse_args(argv)

    if importlib.metadata.version("verl") == "0.9.1":
        return _main_v1(args)
    from treetune_verl.verl import EntropyAgentLoopManager

    config = standalone_config(_model_path(args.model), Path(tempfile.mkdtemp()))
    with open_dict(config):
        config.actor_rollout_ref.rollout.n = args.n
        config.actor_rollout_ref.rollout.engine_kwargs.sglang.max_running_requests = args.max_running_requests
        config.actor_rollout_ref.rollout.custom = {"entropy_forecast": {"every": 1}}
        config.actor_rollout_ref.model.external_lib = "treetune_verl.verl.process_setup"
    with pytest.MonkeyPatch.context() as monkeypatch, ray_session(monkeypatch):
        manager = EntropyAgentLoopManager.create(config)
        rollout_eval = manager.rollout_eval
        manager.generate_sequences(_batch(args.prompts, args.n, -1))  # warm-up (graphs, allocator, E's path)

        def call(arm: str, round_: int) -> tuple[float, dict[str, float]]:
            manager.rollout_eval = rollout_eval if arm == "with" else None
            start = time.perf_counter()
            out = manager.generate_sequences(_batch(args.prompts, args.n, round_))
            seconds = time.perf_counter() - start
            if arm == "without":
                return seconds, {}
            pending = out.meta_info[PENDING_METRICS_KEY]
            return seconds, {key: pending[key] for key in ("probe/eval_gen_s", "probe/eval_gen_token_share")}

        _rounds(args, call, "0.7.1")
    return 0


def _rounds(args: argparse.Namespace, call: Any, verl_version: str) -> None:
    """ABBA rounds of ``call(arm, round) -> (seconds, E's metrics)`` for arms ``with`` / ``without`` E; the JSON
    rewritten after every round (an interrupted run keeps its rounds), the summary printed."""
    rounds = []
    for r in range(args.rounds):
        order = ("without", "with") if r % 4 in (0, 3) else ("with", "without")
        record: dict[str, float] = {}
        for arm in order:
            record[f"{arm}_s"], metrics = call(arm, r)
            record.update(metrics)
        record["gen_ratio"] = record["with_s"] / record["without_s"]
        record["extra_share"] = 1 - record["without_s"] / record["with_s"]
        rounds.append(record)
        print(json.dumps({"round": r, **{k: round(v, 4) for k, v in record.items()}}), flush=True)
        result = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": platform.platform(),
            "verl": verl_version,
            "summary": _summary(rounds),
            "rounds": rounds,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


def _v1_call(manager, prompts: int, n: int, round_: int) -> tuple[float, dict[str, float]]:
    """One V1 dispatch, timed until every prompt is finished; E's metrics when the manager marked E; the rows and
    E taken out of TransferQueue after."""
    import transfer_queue as tq

    from treetune_tests.treetune_verl.verl.v0_9_1.test_v1_rollout_standalone_on_cpu import _prompts
    from treetune_verl.verl.v0_9_1.rollout_eval import take_rollout_eval

    contents = [f"write a short poem about the number {round_ * prompts + b}" for b in range(prompts)]
    batch = _prompts(["entropy_single_turn_agent"] * prompts, contents, rollout_n=n)
    uids = list(batch["uid"])
    start = time.perf_counter()
    tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "pending"} for _ in uids])
    manager.generate_sequences(batch)
    while True:
        listed = tq.kv_list(partition_id="train").get("train", {})
        if all(listed.get(uid, {}).get("status") in ("finished", "failure") for uid in uids):
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - start
    assert all(listed[uid]["status"] == "finished" for uid in uids), {uid: listed[uid] for uid in uids}
    rows = [key for key in listed if key not in uids]
    metrics = {}
    if manager.rollout_eval is not None:
        tokens = sum(int(listed[key]["response_len"]) for key in rows)
        _, metrics = take_rollout_eval(manager.rollout_eval, tokens, set(uids))  # every group trains (no over-sampling)
    tq.kv_clear(keys=list(listed), partition_id="train")
    return seconds, metrics


def _main_v1(args: argparse.Namespace) -> int:
    """The comparison on verl 0.9.1's V1 rollout path (module docstring)."""
    from treetune_tests.treetune_verl.verl.v0_9_1.test_v1_rollout_standalone_on_cpu import _config, _v1_rollout

    config = _config(
        _model_path(args.model), Path(tempfile.mkdtemp()), overrides=[f"actor_rollout_ref.rollout.n={args.n}"]
    )
    with open_dict(config):
        config.actor_rollout_ref.rollout.engine_kwargs.sglang.max_running_requests = args.max_running_requests
        config.actor_rollout_ref.rollout.custom = {"entropy_forecast": {"every": 1}}
    with pytest.MonkeyPatch.context() as monkeypatch, _v1_rollout(config, monkeypatch) as (_, _, _, manager):
        rollout_eval = manager.rollout_eval
        _v1_call(manager, args.prompts, args.n, -1)  # warm-up (graphs, allocator, E's path)

        def call(arm: str, round_: int) -> tuple[float, dict[str, float]]:
            manager.rollout_eval = rollout_eval if arm == "with" else None
            return _v1_call(manager, args.prompts, args.n, round_)

        _rounds(args, call, "0.9.1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
