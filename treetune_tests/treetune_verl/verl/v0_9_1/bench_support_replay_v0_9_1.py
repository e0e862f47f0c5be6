# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Trainer-side cost of support replay on verl 0.9.1: the actor's old-log-prob pass and update with every response
token masked to its sampled support, against the same pass and update without, side by side on the same rows.

verl 0.9.1's real ``ActorRolloutRefWorker`` (role ``actor``, built by its own ``init_model``: ``FSDPEngineWithLMHead``,
FSDP2 in float32, one gloo rank, AdamW, the padded layout of the CPU e2e runs) with the CPU runtime patches (this
script re-executes itself with their environment, ``engine_actor.CPU_RUNTIME``) and our seams installed as
``external_lib`` installs them. Each round builds one batch as the V1 trainer hands it over
(``engine_actor.v1_rows``: ``--prompts`` x ``--n`` rows of ``--response-length`` tokens, random ids) and runs it
through both arms in ABBA order across rounds: ``plain`` (the rows' ``extra_fields`` hold their entropies only, as
with entropy mode ``tempered``) and ``replay`` (and each response token's truncated support, ``--support-mean`` ids on
average, ``ppo/support_bench.token_supports``). An arm is the actor's part of a training step:
``compute_log_prob`` with entropy (``_compute_old_log_prob``), then ``update_actor`` on those log-probs. Reported
(median over rounds, distribution-free 95 % CI, >= 6 rounds), as verl 0.7.1's ``ppo/bench_support_replay.py``:

- ``overhead``: ``replay_s / plain_s - 1`` of the same round (issue 48's acceptance 3: <= 0.05), and
  ``overhead_cpu``, the same of the process's CPU seconds (what a neighbour's stolen time does not inflate);
- ``plain_s``, ``replay_s``; each arm's mean old log-prob (the replay arm's must lie far above: the mask ran); and
  the supports' memory per token (``support_bench.support_memory``).

    python treetune_tests/treetune_verl/verl/v0_9_1/bench_support_replay_v0_9_1.py --model smollm2 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO_ROOT))

from treetune_tests.treetune_verl.ppo.support_bench import (  # noqa: E402
    arguments,
    run_rounds,
    support_memory,
    token_supports,
)
from treetune_tests.treetune_verl.verl.v0_9_1.bench_forecast_cost_v0_9_1 import _free_port, _model_path  # noqa: E402
from treetune_tests.treetune_verl.verl.v0_9_1.engine_actor import (  # noqa: E402
    CPU_RUNTIME,
    actor_config,
    join_process_group,
    v1_rows,
)
from treetune_verl.batch_keys import RESPONSE_ENTROPY_KEY, RESPONSE_SUPPORT_KEY  # noqa: E402

TEMPERATURE = 1.0


def _rows(args: argparse.Namespace, vocab: int, seed: int):
    """One round's rows: prompts, responses, advantages (+-1 alternating), and each row's supports."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (args.prompts, args.prompt_length), generator=gen).repeat_interleave(args.n, 0)
    rows = args.prompts * args.n
    responses = [torch.randint(3, vocab, (args.response_length,), generator=gen) for _ in range(rows)]
    advantages = [torch.full((args.response_length,), 1.0 if k % 2 == 0 else -1.0) for k in range(rows)]
    supports = token_supports([r.tolist() for r in responses], vocab, args.support_mean, seed)
    return list(prompts), responses, advantages, supports


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, REPO_ROOT / "outputs" / "bench" / "support_replay_v0_9_1.json").parse_args(argv)

    if any(os.environ.get(key) != value for key, value in CPU_RUNTIME.items()):
        # verl's CPU runtime patches are installed at interpreter start (tools/cpu_shims/verl_cpu)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **CPU_RUNTIME})

    import torch
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import response_from_nested

    import treetune_verl.verl.process_setup  # noqa: F401  (external_lib: installs the actor seams)

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
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    vocab = worker.actor.model_config.hf_config.vocab_size

    def step(seed: int, replay: bool) -> tuple[float, float, float]:
        """Wall and process CPU seconds of the actor's part of a step and the old log-probs' mean (nats)."""
        prompts, responses, advantages, supports = _rows(args, vocab, seed)
        extra_fields = [{RESPONSE_ENTROPY_KEY: [1.0] * len(r)} for r in responses]
        if replay:
            for fields, row in zip(extra_fields, supports, strict=True):
                fields[RESPONSE_SUPPORT_KEY] = row
        batch = v1_rows(
            prompts,
            responses,
            advantages,
            rows,
            extra_fields=extra_fields,
            temperature=TEMPERATURE,
            calculate_entropy=True,
        )
        start, cpu = time.perf_counter(), time.process_time()
        log_probs = response_from_nested(worker.compute_log_prob(batch.copy())["log_probs"], batch["response_mask"])
        batch["old_log_probs"] = log_probs
        worker.update_actor(batch)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        return seconds, cpu_seconds, float(torch.cat(list(log_probs.unbind(0))).mean())

    step(10_000, replay=True)  # warm-up of both paths (AdamW state, allocator)
    memory = support_memory(_rows(args, vocab, 10_000)[3])
    result = run_rounds(args, "0.9.1", step, memory)
    torch.distributed.destroy_process_group()
    print(json.dumps({"summary": result["summary"], "memory": memory}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
