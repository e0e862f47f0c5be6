# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""One forward over E (``directional.token_values``, the forecast's forwards without graph) with each prompt computed
once for its G responses against whole rows, side by side on the same E: what sets ``MIN_SHARED_PROMPT_TOKENS``.

SmolLM2 under FSDP2 (one gloo rank, float32, one torch thread, as the forecast cost bench), E as the rollout hands it
(``given_eval``, every response the whole budget long) for ``--prompts`` x ``--n`` rows; the two ways alternate ABAB
for ``--repeats`` rounds. Prints and writes (``--out``) the median seconds of each way and the median of the
per-round ratio shared / whole rows with its distribution-free 95 % CI.

    python treetune_tests/treetune_verl/forecast/bench_token_values.py --prompts 2 --n 2 --prompt-length 48 \
        --response-length 64
    python treetune_tests/treetune_verl/forecast/bench_token_values.py --prompts 1 --n 2 --prompt-length 32 \
        --response-length 32
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from treetune_tests.treetune_verl.forecast.given_eval import given_eval  # noqa: E402
from treetune_tests.treetune_verl.sglang.bench_entropy_throughput import median_ci95  # noqa: E402
from treetune_verl.forecast.directional import token_values  # noqa: E402
from treetune_verl.forecast.verl_batch import rollout_eval_share  # noqa: E402
from treetune_verl.probe import teacher_forcing  # noqa: E402
from treetune_verl.probe.components import ProbeComponents  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=48)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "bench" / "token_values.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from treetune_verl.model_cache import smollm2_path

    store = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=0, world_size=1, timeout=datetime.timedelta(600)
    )
    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), dtype=torch.float32, attn_implementation="sdpa")
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (args.prompt_length,), generator=gen) for _ in range(args.prompts)]
    uids = [f"uid-{b}" for b in range(args.prompts)]
    _, E = rollout_eval_share(given_eval(uids, prompts, args.n, vocab, args.response_length, 0, full_budget=True), 0)
    comps = ProbeComponents(model, {"generation": {"temperature": 1.0, "top_p": 1.0}})
    rows = args.prompts * args.n

    def timed(min_shared_tokens: int) -> float:
        teacher_forcing.MIN_SHARED_PROMPT_TOKENS = min_shared_tokens
        start = time.perf_counter()
        token_values(comps, E, rows)
        return time.perf_counter() - start

    timed(1), timed(10**9)  # warm-up
    shared, whole = [], []
    for _ in range(args.repeats):
        shared.append(timed(1))  # prompts shared however few tokens that saves
        whole.append(timed(10**9))  # never shared
    dist.destroy_process_group()
    ratios = [s / w for s, w in zip(shared, whole, strict=True)]
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "prompt_tokens_saved": (args.n - 1) * args.prompts * args.prompt_length,
        "shared_s": statistics.median(shared),
        "whole_rows_s": statistics.median(whole),
        "ratio_shared_over_whole": statistics.median(ratios),
        "ratio_ci95": median_ci95(ratios),
    }
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
