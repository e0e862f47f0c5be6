# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Trainer-side cost of support replay on verl 0.7.1: the actor's old-log-prob pass and update with every response
token masked to its sampled support, against the same pass and update without, side by side on the same rows.

verl 0.7.1's real ``DataParallelPPOActor`` on an FSDP2-wrapped model (one gloo rank, CPU, float32, the padded layout
of the CPU e2e runs), AdamW, our actor seams installed as ``external_lib`` installs them. Each round builds one batch
(``--prompts`` x ``--n`` rows of ``--response-length`` tokens, random ids) and runs it through both arms in ABBA order
across rounds: ``plain`` (no ``response_support`` column: verl's own pass) and ``replay`` (every response token with a
truncated support of ``--support-mean`` ids on average, ``support_bench.token_supports``). An arm is what the trainer
runs in the actor for a step: ``compute_log_prob(calculate_entropy=True)`` (``_compute_old_log_prob``) then
``update_policy`` on those log-probs. Reported (median over rounds, distribution-free 95 % CI, >= 6 rounds):

- ``overhead``: ``replay_s / plain_s - 1`` of the same round (issue 48's acceptance 3: <= 0.05), and
  ``overhead_cpu``, the same of the process's CPU seconds (what a neighbour's stolen time does not inflate);
- ``plain_s``, ``replay_s``; each arm's mean old log-prob (the replay arm's must lie far above: the mask ran); and
  the supports' memory per token (``support_bench.support_memory``).

verl 0.9.1's bench is ``verl/v0_9_1/bench_support_replay_v0_9_1.py`` (its engine worker), with the same arms and
figures. Writes JSON (``--out``).

    python treetune_tests/treetune_verl/ppo/bench_support_replay.py --model smollm2 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from treetune_tests.treetune_verl.forecast.bench_forecast_cost import fsdp2_actor  # noqa: E402
from treetune_tests.treetune_verl.ppo.support_bench import (  # noqa: E402
    arguments,
    run_rounds,
    support_memory,
    token_supports,
)
from treetune_verl.batch_keys import RESPONSE_SUPPORT_KEY  # noqa: E402

TEMPERATURE = 1.0


def _batch(vocab: int, args: argparse.Namespace, seed: int):
    """One round's rows (as ``bench_forecast_cost._batch``) and their supports (object ``[rows]``)."""
    from verl import DataProto

    gen = torch.Generator().manual_seed(seed)
    rows = args.prompts * args.n
    prompt = torch.randint(3, vocab, (args.prompts, args.prompt_length), generator=gen).repeat_interleave(args.n, 0)
    responses = torch.randint(3, vocab, (rows, args.response_length), generator=gen)
    mask = torch.ones(rows, args.response_length, dtype=torch.int64)
    attention = torch.ones(rows, args.prompt_length + args.response_length, dtype=torch.int64)
    tensors = {
        "input_ids": torch.cat([prompt, responses], dim=1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": mask,
        "advantages": (torch.tensor([1.0, -1.0]).repeat(rows // 2)[:, None] * mask).float(),
    }
    uid = np.array([f"p{seed}-{k // args.n}" for k in range(rows)], dtype=object)
    data = DataProto.from_dict(tensors, non_tensors={"uid": uid}, meta_info={"temperature": TEMPERATURE})
    data.meta_info.update(pad_token_id=0, micro_batch_size=rows, use_dynamic_bsz=False)
    supports = np.empty(rows, dtype=object)
    supports[:] = token_supports(responses.tolist(), vocab, args.support_mean, seed)
    return data, supports


def _step(actor, data) -> tuple[float, float, float]:
    """Wall and process CPU seconds of the actor's part of a step (the old log-probs, then the update on them) and
    the old log-probs' mean (nats): over supports of a few ids it is far above the whole vocabulary's, the sign the
    mask ran."""
    start, cpu = time.perf_counter(), time.process_time()
    out = actor.compute_log_prob(data, calculate_entropy=True)
    data.batch["old_log_probs"] = out["log_probs"]
    actor.update_policy(data)
    return time.perf_counter() - start, time.process_time() - cpu, float(out["log_probs"].mean())


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, REPO_ROOT / "outputs" / "bench" / "support_replay_v0_7_1.json").parse_args(argv)
    torch.set_num_threads(args.threads)

    from treetune_verl.verl.v0_7_1.actor_seams import install

    install()
    actor, vocab = fsdp2_actor(args.model, args.prompts * args.n, args.n)

    def step(seed: int, replay: bool) -> tuple[float, float, float]:
        data, supports = _batch(vocab, args, seed)
        if replay:
            data.non_tensor_batch[RESPONSE_SUPPORT_KEY] = supports
        return _step(actor, data)

    step(10_000, replay=True)  # warm-up of both paths (AdamW state, allocator)
    memory = support_memory(list(_batch(vocab, args, seed=10_000)[1]))
    result = run_rounds(args, "0.7.1", step, memory)
    dist.destroy_process_group()
    print(json.dumps({"summary": result["summary"], "memory": memory}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
