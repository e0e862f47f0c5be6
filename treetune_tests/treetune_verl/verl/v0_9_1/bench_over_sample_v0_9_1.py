# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling on verl 0.9.1, measured in four arms on heavy-tailed lengths: what each trains per second and what it
throws away (the verl 0.7.1 bench, ``agent_loop/bench_over_sample.py``, on the current stack's path).

The real rollout path of the carry-over test (``test_v1_rollout_standalone_on_cpu.py``): real Ray, verl 0.9.1's
standalone servers with our replica on a real sglang 0.5.12 CPU Engine, the block's manager (its resuming client) with
two agent-loop workers, real TransferQueue, our replay buffer, and the real wrapped trainer hooks
(``prepare_step``, ``on_init_end``, ``on_sample_end``, ``on_step_end``) on the test's stand-in trainer, whose weight
update loads nothing (the weights stay; what is measured is the rollout). A step has ``--groups`` prompts of ``--n``
rows; every row is a ``fixed_length_agent`` row generating exactly its own length, drawn per row from a Pareto law
capped at ``--response-length``. Arms:

- ``stock``: ``over_sample_rate`` 0, every row completes and trains;
- ``abort_drop``: rate ``--rate`` counted in rows: each row its own prompt (verl's per-prompt ``__rollout_n__`` = 1),
  so the buffer keeps the first rows and aborts the others, groups may be cut;
- ``groups``: rate ``--rate``, whole groups kept, the others aborted and dropped;
- ``carry``: as ``groups`` with carry-over: the groups not kept stay running (paused over the weight update) and
  train at a later step; those past ``--max-staleness`` are dropped.

A run is ``--steps`` consecutive steps of one arm on a fresh buffer; each step dispatches what verl would
(``train_batch_size`` prompts, less the carried groups with carry-over) from the block's prompt stream. A block runs
every arm once on the same stream, in a seeded shuffled order. Per run: rollout seconds (from the step's dispatch
through the end of sampling, and the weight-update hooks; not the ``--train-s`` seconds of "training" between them,
during which the servers idle, paused with carry-over), trained tokens (the
response tokens of the rows the buffer returned), discarded tokens (``rollout/aborted_tokens``: rows of dropped
groups), and for ``carry`` the tokens of the groups still running after the last step (aborted then, reported apart:
a longer run trains them). One warm-up run per arm is not counted.

Why ``--train-s``: verl's resuming client sleeps 1 s after a cut attempt before re-sending it (``llm_server.py``
``FullyAsyncLLMServerClient.generate``); a re-sent request waits in sglang's tokenizer manager until the resume
(``async_sglang_server.py`` ``abort_all_requests``). A real training phase outlasts that second, so the carried rows
go on as soon as the servers resume; with no pause at all they would idle for most of a second at every step.

    .venv-current/bin/python treetune_tests/treetune_verl/verl/v0_9_1/bench_over_sample_v0_9_1.py --blocks 8
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import pytest
from omegaconf import open_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # run as a script from anywhere

from treetune_tests.treetune_verl.agent_loop.fixed_length_loop import FIXED_LENGTH_LOOP  # noqa: E402
from treetune_tests.treetune_verl.agent_loop.standalone import REPO_ROOT, model_with_short_turns  # noqa: E402
from treetune_tests.treetune_verl.over_sample_arms import (  # noqa: E402
    ARMS,
    add_arm_arguments,
    heavy_tailed_lengths,
    run_record,
    write_report,
)
from treetune_tests.treetune_verl.verl.v0_9_1.test_v1_rollout_standalone_on_cpu import (  # noqa: E402
    _config,
    _sync_buffer,
    _Trainer,
    _v1_rollout,
)
from treetune_verl.trainer.features import SAMPLER_KEY, SAMPLER_NAME, SAMPLER_PATH, RunFeatures  # noqa: E402

TRAIN = "train"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arm_arguments(parser, steps=8)
    parser.add_argument(
        "--train-s", type=float, default=1.0, help="the training phase between sampling and the weight update"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "over_sample_v0_9_1.json")
    args = parser.parse_args(argv)

    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from treetune_tests.tiny_model import build_tiny_qwen2
    from treetune_verl.model_cache import models_dir
    from treetune_verl.verl.v0_9_1 import trainer_seams

    work = Path(tempfile.mkdtemp(prefix="bench_over_sample_v0_9_1_"))
    model = model_with_short_turns(build_tiny_qwen2(models_dir() / "tiny-qwen2-seed0", seed=0), work / "m")
    overrides = [  # the carry arm's run; the other arms run with fewer features on the same servers and workers
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.over_sample_rate={args.rate}",
        "+actor_rollout_ref.rollout.custom.over_sample.carry_over=true",
        f"+actor_rollout_ref.rollout.custom.over_sample.max_staleness={args.max_staleness}",
        "algorithm.rollout_correction.rollout_is=token",
        "data.gen_batch_size=1",
        f"{SAMPLER_KEY}.path={SAMPLER_PATH}",
        f"{SAMPLER_KEY}.name={SAMPLER_NAME}",
    ]
    config = _config(
        model, work / "cfg", loops=[FIXED_LENGTH_LOOP], overrides=overrides, response_length=args.response_length
    )
    carry = RunFeatures.from_config(config, rollout_entropy=True)
    features = {
        "stock": dataclasses.replace(carry, over_sample_rate=0.0, carry_over=False),
        "abort_drop": dataclasses.replace(carry, carry_over=False),
        "groups": dataclasses.replace(carry, carry_over=False),
        "carry": carry,
    }
    started, runs, rng = time.time(), [], random.Random(args.seed)

    def stream(block: int | str) -> dict[str, tuple[str, str]]:
        """The block's prompts in dispatch order, each with its rows' lengths: key -> (loop, prompt)."""
        plans = {}
        for group in range(args.steps * args.groups):
            lengths = heavy_tailed_lengths(args.n, rng, args.alpha, args.min_tokens, args.response_length)
            key = f"{block}-{group}"  # also in the prompt: the loop counts a prompt's rows by its text
            plans[key] = ("fixed_length_agent", f"{key} lengths=" + "/".join(map(str, lengths)))
        return plans

    def by_row(plans: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
        """The abort-and-drop arm's prompts: each row of a group its own prompt, same lengths."""
        rows = {}
        for key, (loop, prompt) in plans.items():
            lengths = prompt.split("lengths=")[1].split("/")
            rows.update({f"{key}/{i}": (loop, f"{key}/{i} lengths={length}") for i, length in enumerate(lengths)})
        return rows

    with pytest.MonkeyPatch.context() as env, _v1_rollout(config, env) as (session, servers, replica, manager):

        def run(arm: str, plans: dict[str, tuple[str, str]]) -> dict:
            trainer_seams.install(features[arm])
            buffer = _sync_buffer()
            buffer.features = features[arm]  # bench only: one set of servers and workers serves every arm
            rows_per_prompt = 1 if arm == "abort_drop" else None
            plans = by_row(plans) if arm == "abort_drop" else plans
            batch_size = args.groups * (args.n if arm == "abort_drop" else 1)
            trainer = _Trainer(config, servers, replica, buffer, manager, {}, plans=plans, rollout_n=rows_per_prompt)
            trainer.next_groups = list(plans)
            with open_dict(trainer.config):
                trainer.config.data.train_batch_size = batch_size
            PPOTrainerSync.on_init_end(trainer)
            seconds = trained = discarded = 0.0
            for step in range(1, args.steps + 1):
                trainer.global_steps = step
                t0 = time.perf_counter()
                PPOTrainer.prepare_step(trainer)
                batch, metrics = buffer.sample(global_steps=step, partition_id=TRAIN, batch_size=batch_size)
                PPOTrainerSync.on_sample_end(trainer)
                seconds += time.perf_counter() - t0
                time.sleep(args.train_s)  # training: the servers idle (paused with carry-over)
                t0 = time.perf_counter()
                tq.kv_clear(partition_id=TRAIN, keys=batch.keys)  # the trainer's end of step
                PPOTrainerSync.on_step_end(trainer)
                seconds += time.perf_counter() - t0
                trained += sum(tag["response_len"] for tag in batch.tags)
                discarded += metrics.get("rollout/aborted_tokens", 0)
            buffer._sync_metadata_from_transfer_queue()  # what is still running: carried groups
            _, _, carried_at_end = buffer._abort_groups(TRAIN, buffer._groups(TRAIN))
            generated = trained + discarded + carried_at_end
            prompts = len(plans) - len(trainer.next_groups)
            return run_record(arm, seconds, trained, generated, discarded, carried_at_end, prompts_dispatched=prompts)

        warm = stream("warm")
        for arm in ARMS:  # warm-up, not counted: the engine's first batches
            run(arm, warm)
        order_rng = random.Random(args.seed + 1)
        for block in range(args.blocks):
            plans = stream(block)
            order = list(ARMS)
            order_rng.shuffle(order)
            for arm in order:
                runs.append({"block": block, **run(arm, plans)})
                print(json.dumps(runs[-1]), flush=True)
        trainer_seams.install(RunFeatures())
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    stack = {name: importlib.metadata.version(name) for name in ("verl", "sglang")}
    write_report(args, runs, started, stack)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
