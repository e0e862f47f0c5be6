# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling, measured in four arms on heavy-tailed lengths: what each trains per second and what it throws away.

The real rollout path of the carry-over test (``test_carry_over_standalone_on_cpu.py``): real Ray, our manager in
verl's standalone mode, a real sglang CPU Engine behind ``EntropySGLangHttpServer``, two agent-loop workers, each
step's prompts through verl's ``RayPPOTrainer._get_gen_batch`` as our seam wraps it. A step has ``--groups`` prompts
of ``--n`` rows; every row is a ``fixed_length_agent`` row generating exactly its own length (``lengths=...``), drawn
per row from a Pareto law capped at ``response_length``: most rows are short, a few run long. Arms:

- ``stock``: ``over_sample_rate`` 0, every row completes and trains;
- ``abort_drop``: rate ``--rate``, counted in rows (each row its own ``uid``, as before whole groups): the rows still
  running at the target are aborted and dropped, groups may be cut;
- ``groups``: rate ``--rate``, whole groups kept, the others aborted and dropped;
- ``carry``: as ``groups``, with carry-over: the aborted groups resume at the next step.

A run is ``--steps`` consecutive steps of one arm (carry-over works across steps), each step fresh prompts from the
block's stream; a block runs every arm once on the same prompts, in a seeded shuffled order, so a drift of the
machine hits all arms alike. Per run: rollout seconds (the steps' ``generate_sequences`` summed), trained tokens
(the response tokens of the rows kept), generated tokens and discarded tokens (generated, then thrown away; for
``carry`` also those still carried at the end, not yet trained). Reported: per block the ratio of each arm's
trained tokens per second to ``stock``'s and to ``abort_drop``'s, as medians with a distribution-free 95 % interval,
and each arm's median discarded share. One warm-up run per arm is not counted.

    python treetune_tests/treetune_verl/agent_loop/bench_over_sample.py --blocks 8 --out outputs/bench/over_sample.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import open_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run as a script from anywhere

from treetune_tests.treetune_verl.agent_loop.standalone import (  # noqa: E402
    REPO_ROOT,
    model_with_short_turns,
    ray_session,
)
from treetune_tests.treetune_verl.agent_loop.test_carry_over_standalone_on_cpu import (  # noqa: E402
    _carry_config,
    _trainer_prompts,
)
from treetune_tests.treetune_verl.over_sample_arms import (  # noqa: E402
    ARMS,
    add_arm_arguments,
    heavy_tailed_lengths,
    run_record,
    write_report,
)
from treetune_verl.agent_loop.carry_over import METRIC_PREFIX, BoundedLoader, CarryOver  # noqa: E402
from treetune_verl.batch_keys import PENDING_METRICS_KEY, ROLLOUT_ABORTED_KEY  # noqa: E402
from treetune_verl.trainer.features import RunFeatures, completion_target  # noqa: E402
from treetune_verl.verl.v0_7_1 import trainer_seams  # noqa: E402


class DroppedTokens(CarryOver):
    """The arms without carry-over: counts what their aborted rows generated, carries nothing (bench only)."""

    def fill_slots(self, batch, step: int) -> None:
        self._resuming, self._metrics = {}, {}  # every step a whole batch: nothing carried, nothing waits

    def keep_aborted(self, uids, resumed, records, aborted, failed, trained_tokens, step) -> dict[str, float]:
        discarded = sum(len(record) for record in records if record is not None)
        generated = discarded + int(np.asarray(trained_tokens)[~np.asarray(aborted)].sum())
        return {METRIC_PREFIX + "tokens_generated": generated, METRIC_PREFIX + "tokens_discarded": discarded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arm_arguments(parser, steps=4)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "over_sample.json")
    args = parser.parse_args(argv)

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from treetune_tests.tiny_model import build_tiny_qwen2
    from treetune_verl.model_cache import models_dir
    from treetune_verl.verl import EntropyAgentLoopManager

    work = Path(tempfile.mkdtemp(prefix="bench_over_sample_"))
    model = model_with_short_turns(build_tiny_qwen2(models_dir() / "tiny-qwen2-seed0", seed=0), work / "m")
    config = _carry_config(model, work / "cfg")
    with open_dict(config):
        config.data.max_response_length = args.response_length  # the rollout's response_length follows it
        config.actor_rollout_ref.rollout.n = args.n
        config.actor_rollout_ref.rollout.over_sample_rate = args.rate
        config.actor_rollout_ref.rollout.custom.over_sample.max_staleness = args.max_staleness
        config.data.train_batch_size = args.groups  # the dataloader's batch: a step's groups
    started, runs, rng = time.time(), [], random.Random(args.seed)

    def prompts(block: int | str, step: int) -> list[tuple[str, str]]:
        """The step's prompts: (uid, the fixed-length loop's plan with each row's length)."""
        plans = []
        for group in range(args.groups):
            lengths = heavy_tailed_lengths(args.n, rng, args.alpha, args.min_tokens, args.response_length)
            uid = f"{block}-{step}-{group}"  # also in the plan: the loop counts a prompt's rows by its text
            plans.append((uid, f"{uid} lengths=" + "/".join(map(str, lengths))))
        return plans

    with pytest.MonkeyPatch.context() as env, ray_session(env):
        manager = EntropyAgentLoopManager.create(config)
        features = RunFeatures.from_config(config, rollout_entropy=True)
        trainer = SimpleNamespace(async_rollout_manager=manager, global_steps=0)

        def run(arm: str, stream: list[list[tuple[str, str]]]) -> dict:
            # bench only: one set of servers, workers and counter serves every arm
            manager._over_sample_rate = 0.0 if arm == "stock" else args.rate
            most_carried = args.groups - completion_target(args.rate, args.groups)
            buffer = CarryOver if arm == "carry" else DroppedTokens
            manager.carry_over = buffer(args.max_staleness, args.groups, most_carried)
            trainer_seams.install(features, manager.carry_over)  # the seams' buffer is the manager's, as trainer_setup
            trainer.train_dataloader = BoundedLoader([], manager.carry_over)  # as the fit seam leaves it
            seconds = trained = generated = discarded = 0.0
            for step, plans in enumerate(stream, start=1):
                trainer.global_steps = step
                batch = _trainer_prompts([uid for uid, _ in plans], [plan for _, plan in plans])
                gen_batch = RayPPOTrainer._get_gen_batch(trainer, batch)  # our seam (carry-over), then verl's
                gen_batch.meta_info["global_steps"] = step
                gen_batch = gen_batch.repeat(repeat_times=args.n, interleave=True)
                if arm == "abort_drop":  # rows counted: each row its own group
                    uids = gen_batch.non_tensor_batch["uid"]
                    gen_batch.non_tensor_batch["uid"] = np.array([f"{u}/{i}" for i, u in enumerate(uids)], dtype=object)
                t0 = time.perf_counter()
                out = manager.generate_sequences(gen_batch)
                seconds += time.perf_counter() - t0
                kept = ~out.batch[ROLLOUT_ABORTED_KEY]
                trained += int(out.batch["response_mask"][kept].sum())
                metrics = out.meta_info[PENDING_METRICS_KEY]
                generated += metrics[METRIC_PREFIX + "tokens_generated"]
                discarded += metrics[METRIC_PREFIX + "tokens_discarded"]
            pending = sum(
                len(row) for group in manager.carry_over._groups.values() for row in group.rows if row is not None
            )
            return run_record(arm, seconds, trained, generated, discarded, pending)

        warm = [prompts("warm", step) for step in range(args.steps)]
        for arm in ARMS:  # warm-up, not counted: the engine's first batches
            run(arm, warm)
        order_rng = random.Random(args.seed + 1)
        for block in range(args.blocks):
            stream = [prompts(block, step) for step in range(args.steps)]
            order = list(ARMS)
            order_rng.shuffle(order)
            for arm in order:
                runs.append({"block": block, **run(arm, stream)})
                print(json.dumps(runs[-1]), flush=True)

    write_report(args, runs, started, {"verl": importlib.metadata.version("verl")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
