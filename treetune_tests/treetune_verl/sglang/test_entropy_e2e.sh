#!/usr/bin/env bash
# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
#
# One GRPO step of stock verl 0.7.1 (python -m verl.trainer.main_ppo, sglang 0.5.6.post2 rollout, FSDP actor) on one
# GPU, with rollout entropy turned on by exactly the override block of the README
# (treetune_verl/config/grpo_entropy_overrides.txt). Checks that every rollout the trainer received carried
# batch["rollout_entropy"] of shape [train_batch_size * n, response_length], float32, non-zero exactly at
# response_mask, and that the step logged timing_s/agent_loop/rollout_entropy/{mean,p50,p90,max}.
#
# The check: one extra override after the block selects ProbedEntropyAgentLoopManager
# (treetune_tests/treetune_verl/agent_loop/e2e_probe.py), the same manager plus a JSON record of each rollout.
#
#   bash treetune_tests/treetune_verl/sglang/test_entropy_e2e.sh   # needs a CUDA GPU; prints SKIP and exits 0 without
#   E2E_PRINT_ARGS=1 bash .../test_entropy_e2e.sh                  # no GPU needed: print main_ppo's arguments and exit
#                                                                  # (test_entropy_verl_config_on_cpu.py composes them)
# Env: MODEL_PATH (default: the packaged SmolLM2-135M-Instruct), PYTHON (default: python), E2E_WORKDIR.
set -xeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python}
PRINT_ARGS=${E2E_PRINT_ARGS:-0}

if [[ "$PRINT_ARGS" != 1 ]] && ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "SKIP: test_entropy_e2e.sh needs a CUDA GPU"
    exit 0
fi

WORK=${E2E_WORKDIR:-${TMPDIR:-/tmp}/treetune_entropy_e2e}
export TREETUNE_E2E_PROBE_DIR="$WORK/probe"
MODEL_PATH=${MODEL_PATH:-$("$PYTHON" -c 'from treetune_verl.model_cache import smollm2_path; print(smollm2_path())')}

TRAIN_BATCH_SIZE=4
ROLLOUT_N=2
RESPONSE_LENGTH=64

# The README block, verbatim (one override per line).
mapfile -t ENTROPY_OVERRIDES < <("$PYTHON" -c 'from treetune_verl.config import read_overrides; print("\n".join(read_overrides()))')

ARGS=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    data.train_files="$WORK/train.parquet"
    data.val_files="$WORK/val.parquet"
    data.train_batch_size=$TRAIN_BATCH_SIZE
    data.max_prompt_length=128
    data.max_response_length=$RESPONSE_LENGTH
    data.return_raw_chat=True
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=$TRAIN_BATCH_SIZE
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.rollout.n=$ROLLOUT_N
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2
    actor_rollout_ref.rollout.agent.num_workers=1
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
    trainer.logger=[console]
    trainer.n_gpus_per_node=1
    trainer.nnodes=1
    trainer.total_training_steps=1
    trainer.val_before_train=False
    trainer.test_freq=-1
    trainer.save_freq=-1
    trainer.project_name=treetune_e2e
    trainer.experiment_name=rollout_entropy
    trainer.default_local_dir="$WORK/checkpoints"
    "${ENTROPY_OVERRIDES[@]}"
    actor_rollout_ref.rollout.agent.agent_loop_manager_class=treetune_tests.treetune_verl.agent_loop.e2e_probe.ProbedEntropyAgentLoopManager
)

if [[ "$PRINT_ARGS" == 1 ]]; then
    printf '%s\n' "${ARGS[@]}"
    exit 0
fi

mkdir -p "$WORK"
rm -rf "$TREETUNE_E2E_PROBE_DIR"

# A tiny GSM8K-style dataset in verl's RLHFDataset format (data_source openai/gsm8k -> verl's gsm8k reward).
"$PYTHON" - "$WORK" <<'EOF'
import sys

import pandas as pd

work = sys.argv[1]
for split, count in (("train", 8), ("val", 4)):
    rows = []
    for i in range(count):
        a, b = 3 + i, 5 + 2 * i
        question = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": question + ' Output the final answer after "####".'}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": i},
            }
        )
    pd.DataFrame(rows).to_parquet(f"{work}/{split}.parquet")
EOF

"$PYTHON" -m verl.trainer.main_ppo "${ARGS[@]}" 2>&1 | tee "$WORK/train.log"

"$PYTHON" - "$TREETUNE_E2E_PROBE_DIR" "$WORK/train.log" $((TRAIN_BATCH_SIZE * ROLLOUT_N)) $RESPONSE_LENGTH <<'EOF'
import json
import pathlib
import sys

probe_dir, log, batch_size, response_length = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
records = sorted(probe_dir.glob("rollout_*.json"))
assert records, f"no rollout reached the probe in {probe_dir}"
for path in records:
    record = json.loads(path.read_text())
    assert record["shape"] == [batch_size, response_length], (path.name, record)
    assert record["dtype"] == "torch.float32" and record["finite"], record
    assert record["model_tokens"] > 0 and record["nonzero_off_mask"] == 0 and record["zero_on_mask"] == 0, record
    assert not any("entropy" in key for key in record["non_tensor_keys"]), record
    assert set(record["metrics"]) == {f"agent_loop/rollout_entropy/{k}" for k in ("mean", "p50", "p90", "max")}
text = pathlib.Path(log).read_text()
assert "timing_s/agent_loop/rollout_entropy/mean" in text, "rollout entropy metrics not in the trainer's log"
print(f"OK: {len(records)} rollout(s) with rollout_entropy [{batch_size}, {response_length}] float32")
EOF
