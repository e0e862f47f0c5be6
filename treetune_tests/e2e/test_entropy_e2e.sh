#!/usr/bin/env bash
# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
#
# A few GRPO steps of stock verl 0.7.1 (python -m verl.trainer.main_ppo: Ray, FSDP2 actor, sglang 0.5.6.post2 rollout
# server) with rollout entropy turned on by exactly the README override block
# (treetune_verl/config/grpo_entropy_overrides.txt, read from that file), then the acceptance check of every step's
# metrics (treetune_tests/e2e/check_metrics.py): finite actor/pg_loss, actor/grad_norm > 0,
# timing_s/agent_loop/rollout_entropy/mean > 0, verl's training/rollout_probs_diff_mean and
# training/rollout_actor_probs_pearson_corr.
#
# Device: CUDA when torch sees it (GPU settings), else CPU: the CPU settings below plus the runtime patches of
# tools/cpu_shims/verl_cpu (switched on by TREETUNE_VERL_CPU_PATCHES=1; installed by tools/cpu_env/setup.sh).
#
#   make e2e                                   # SmolLM2-135M, 2 steps, outputs/e2e/
#   make e2e E2E_MODEL=tiny ARGS="trainer.total_training_steps=3"
#   make e2e E2E_MODEL=tiny E2E_VARIANT=full   # then: make e2e E2E_MODEL=tiny E2E_VARIANT=resume
#   bash treetune_tests/e2e/test_entropy_e2e.sh [hydra overrides...]   # extra overrides go last (they win)
#   E2E_PRINT_ARGS=1 bash treetune_tests/e2e/test_entropy_e2e.sh       # print main_ppo's arguments, run nothing
#   E2E_BLOCK=0 make e2e E2E_MODEL=tiny        # stock verl: the same run without the override block
#
# E2E_BLOCK=0 (the stock arm of treetune_tests/e2e/bench_e2e_overhead.py): the same arguments minus the override
# block, plus actor_rollout_ref.rollout.name=sglang (verl's default is ???; the block sets it) and
# actor_rollout_ref.rollout.calculate_log_probs=True (the block forces it; both arms then compute rollout logprobs, so
# their difference is the entropy path alone), with verl's stock manager, server, workers and loop
# (single_turn_agent). The checks that need the block (rollout entropy mean, entropy agreement) are skipped
# (check_metrics --no-entropy); not with E2E_PROBE=1. Default 1.
#
# Variants (E2E_VARIANT):
#   base    (default) one FSDP process, no reference model, no validation, no checkpoint; E2E_STEPS default 2.
#   full    two FSDP training processes on gloo (trainer.n_gpus_per_node=2: two declared GPUs, two placement bundles,
#           two sglang rollout replicas with TP 1), a reference model and the KL loss (use_kl_loss, low_var_kl, coef
#           0.01), greedy validation before training and after every step (val_before_train, test_freq=1; the
#           generations dumped to $E2E_WORKDIR/validation/<step>.jsonl), a checkpoint after every step (save_freq=1);
#           E2E_STEPS default 1; workdir default outputs/e2e-full. Extra checks: check_metrics --kl --val.
#   resume  the full settings, resumed (trainer.resume_mode=auto) from a copy of E2E_RESUME_FROM/checkpoints (default
#           outputs/e2e-full, the saved run's workdir; left unchanged) up to E2E_STEPS (default 2), no checkpoint;
#           workdir default outputs/e2e-resume. Extra checks: the trained steps start right after the saved one
#           (--first-step), --kl (kl_loss > 0 at step 2: the actor is not the initial model), --val, and the
#           validation before training (the loaded weights) reproduces the saved run's validation of the saved step
#           token for token (--same-generations).
#
# Env: E2E_MODEL (smollm2 | tiny: the random tiny Qwen2 of treetune_tests/tiny_model.py), MODEL_PATH (overrides
# E2E_MODEL), E2E_DEVICE (auto | cpu | cuda), E2E_VARIANT (above), E2E_STEPS (trainer.total_training_steps; default
# per variant), E2E_NPROC (training processes = declared GPUs on CPU; default 1 for base, 2 otherwise), E2E_NNODES
# (trainer.nnodes, default 1: E2E_NPROC / E2E_NNODES processes per node; with RAY_ADDRESS, a running cluster of that
# many nodes: README, "On a Ray cluster that already runs"),
# E2E_WORKDIR (default per variant), E2E_RESUME_FROM (resume only), E2E_OVER_SAMPLE (rollout.over_sample_rate, above), E2E_CARRY_OVER=1 (with E2E_OVER_SAMPLE: aborted groups resumed at the next step, with verl's token-level rollout correction), E2E_PG_TOKEN_QUANTILE (forking tokens, above), E2E_SHAPING_ALPHA (advantage shaping, below), E2E_FORECAST=<k> (the live entropy forecast every k steps, below), E2E_PROBE=1 (also select the probing manager,
# treetune_tests/e2e/e2e_probe.py, and check the shape/dtype/mask alignment of every rollout's
# batch["rollout_entropy"]), E2E_MAX_PROBS_DIFF / E2E_MIN_PEARSON (bounds at every step; CPU defaults 1e-3 / 0.999,
# empty: no bound), PYTHON (default: python), RAY_TMPDIR (default /tmp/treetune_e2e_ray).
# Writes $E2E_WORKDIR/{train,val}.parquet, train.log, metrics.jsonl (verl's file logger), summary.json, and for full /
# resume validation/<step>.jsonl and checkpoints/ (base and full remove stale checkpoints first).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python}
PRINT_ARGS=${E2E_PRINT_ARGS:-0}
PROBE=${E2E_PROBE:-0}
BLOCK=${E2E_BLOCK:-1}
case "$BLOCK" in
    0 | 1) ;;
    *) echo "E2E_BLOCK must be 0 or 1, got ${BLOCK}" >&2; exit 2 ;;
esac
if [[ "$BLOCK" == 0 && "$PROBE" == 1 ]]; then
    echo "E2E_PROBE=1 needs the override block (E2E_BLOCK=1)" >&2
    exit 2
fi
VARIANT=${E2E_VARIANT:-base}
case "$VARIANT" in
    base) DEFAULT_STEPS=2 DEFAULT_NPROC=1 ;;
    full) DEFAULT_STEPS=1 DEFAULT_NPROC=2 ;;
    resume) DEFAULT_STEPS=2 DEFAULT_NPROC=2 ;;
    *) echo "E2E_VARIANT must be base, full or resume, got ${VARIANT}" >&2; exit 2 ;;
esac
STEPS=${E2E_STEPS:-$DEFAULT_STEPS}
NPROC=${E2E_NPROC:-$DEFAULT_NPROC}
NNODES=${E2E_NNODES:-1}
if (( NNODES < 1 || NPROC % NNODES )); then
    echo "FAIL: E2E_NPROC=$NPROC training processes do not split over E2E_NNODES=$NNODES nodes" >&2
    exit 1
fi
DEFAULT_WORK=$ROOT/outputs/e2e
[[ "$VARIANT" != base ]] && DEFAULT_WORK=$ROOT/outputs/e2e-$VARIANT
WORK=${E2E_WORKDIR:-$DEFAULT_WORK}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
FIRST_STEP=1
if [[ "$VARIANT" == resume ]]; then
    RESUME_FROM=${E2E_RESUME_FROM:-$ROOT/outputs/e2e-full}
    TRACKER="$RESUME_FROM/checkpoints/latest_checkpointed_iteration.txt"
    if [[ ! -f "$TRACKER" ]]; then
        echo "FAIL: E2E_VARIANT=resume needs a saved run: no $TRACKER (run E2E_VARIANT=full first)" >&2
        exit 1
    fi
    RESUME_FROM=$(cd "$RESUME_FROM" && pwd)
    if [[ "$RESUME_FROM" == "$WORK" ]]; then
        echo "FAIL: E2E_RESUME_FROM must be another run's workdir than E2E_WORKDIR ($WORK)" >&2
        exit 2
    fi
    FIRST_STEP=$(($(cat "$TRACKER") + 1))
fi

# Caches inside the repo (as the Makefile sets them); no hub access.
export TREETUNE_CACHE_DIR=${TREETUNE_CACHE_DIR:-$ROOT/.cache}
export HF_HOME=${HF_HOME:-$ROOT/.cache/hf}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$ROOT/.cache/triton}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

DEVICE=${E2E_DEVICE:-auto}
if [[ "$DEVICE" == auto ]]; then
    DEVICE=$("$PYTHON" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
fi

# The stack is the installed verl's: 0.7.1 (pinned, with sglang 0.5.6.post2) or 0.9.1 (current, with sglang 0.5.12;
# `make e2e STACK=current`). On the current stack the block also names the actor entry point (external_lib): verl 0.9.1
# builds the servers before it loads the block's manager, and that module selects the entropy server
# (treetune_verl/verl/v0_9_1/process_setup.py). Over-sampling adds its replay buffer there (and carry-over fetches
# the fresh prompts one at a time); the forecast and managed agents are refused there so far.
VERL_VERSION=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("verl"))')
case "$VERL_VERSION" in
    0.7.1) STACK=pinned ;;
    0.9.1) STACK=current ;;
    *) echo "FAIL: verl $VERL_VERSION is installed; this script runs verl 0.7.1 (pinned) or 0.9.1 (current)" >&2; exit 2 ;;
esac

case "${E2E_MODEL:-smollm2}" in
    smollm2) DEFAULT_MODEL='from treetune_verl.model_cache import smollm2_path; print(smollm2_path())' ;;
    tiny) DEFAULT_MODEL='from treetune_tests.tiny_model import build_tiny_qwen2 as b; from treetune_verl.model_cache import models_dir as m; print(b(m() / "tiny-qwen2-seed0", seed=0))' ;;
    *) echo "E2E_MODEL must be smollm2 or tiny, got ${E2E_MODEL}" >&2; exit 2 ;;
esac
MODEL_PATH=${MODEL_PATH:-$("$PYTHON" -c "$DEFAULT_MODEL")}

# Variant settings (base: verl's defaults off; full and resume: see the header).
USE_KL=False VALIDATE=False TEST_FREQ=-1 SAVE_FREQ=-1 RESUME_MODE=disable
if [[ "$VARIANT" != base ]]; then USE_KL=True VALIDATE=True TEST_FREQ=1; fi
[[ "$VARIANT" == full ]] && SAVE_FREQ=1
[[ "$VARIANT" == resume ]] && RESUME_MODE=auto

TRAIN_BATCH_SIZE=4
ROLLOUT_N=2
RESPONSE_LENGTH=64

# The README block, verbatim (one override per line).
mapfile -t ENTROPY_OVERRIDES < <("$PYTHON" -c 'from treetune_verl.config import read_overrides; print("\n".join(read_overrides()))')

# Over-sampling with abort (E2E_OVER_SAMPLE=<rate>, e.g. 0.25): verl's own rollout.over_sample_rate, the estimator
# over completed rows and the actor's loss fix (treetune_verl/ppo); check_metrics --aborted-ratio then checks the
# exact aborted share at every step. Needs the override block.
OVER_SAMPLE=${E2E_OVER_SAMPLE:-0}
ADV_ESTIMATOR=grpo
if [[ "$OVER_SAMPLE" != 0 ]]; then
    [[ "$BLOCK" == 1 ]] || { echo "E2E_OVER_SAMPLE needs the override block (E2E_BLOCK=1)" >&2; exit 2; }
    ADV_ESTIMATOR=grpo_valid
fi
CARRY_OVER=${E2E_CARRY_OVER:-0}
if [[ "$CARRY_OVER" == 1 && "$OVER_SAMPLE" == 0 ]]; then
    echo "E2E_CARRY_OVER=1 needs over-sampling (E2E_OVER_SAMPLE=<rate>)" >&2
    exit 2
fi

ARGS=(
    algorithm.adv_estimator=$ADV_ESTIMATOR
    algorithm.use_kl_in_reward=False
    data.train_files="$WORK/train.parquet"
    data.val_files="$WORK/val.parquet"
    data.train_batch_size=$TRAIN_BATCH_SIZE
    data.max_prompt_length=128
    data.max_response_length=$RESPONSE_LENGTH
    data.return_raw_chat=True
    data.dataloader_num_workers=0
    reward.custom_reward_function.path="$ROOT/treetune_tests/e2e/arithmetic_reward.py"
    reward.custom_reward_function.name=compute_score
    reward.num_workers=1
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.actor.optim.lr=1e-4
    actor_rollout_ref.actor.ppo_mini_batch_size=$TRAIN_BATCH_SIZE
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.actor.use_kl_loss=$USE_KL
    actor_rollout_ref.rollout.n=$ROLLOUT_N
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
    actor_rollout_ref.rollout.agent.num_workers=1
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
    trainer.logger=['console','file']
    trainer.n_gpus_per_node=$((NPROC / NNODES))
    trainer.nnodes=$NNODES
    trainer.total_training_steps=$STEPS
    trainer.val_before_train=$VALIDATE
    trainer.test_freq=$TEST_FREQ
    trainer.save_freq=$SAVE_FREQ
    trainer.resume_mode=$RESUME_MODE
    trainer.project_name=treetune_e2e
    trainer.experiment_name=rollout_entropy
    trainer.default_local_dir="$WORK/checkpoints"
)
if [[ "$VARIANT" != base ]]; then
    # The reference model's log-probs for the KL loss (verl's low-variance estimator "k3"), and the greedy validation
    # generations of every validation dumped to $WORK/validation/<step>.jsonl (the resume check compares them).
    ARGS+=(
        actor_rollout_ref.actor.kl_loss_coef=0.01
        actor_rollout_ref.actor.kl_loss_type=low_var_kl
        trainer.validation_data_dir="$WORK/validation"
    )
fi

if [[ "$DEVICE" == cpu ]]; then
    # What verl's trainer needs on a machine without an accelerator (see treetune_specs/2026-11-23-grpo-e2e.md):
    # one declared (not real) GPU per training process and a custom Ray resource literally named "cpu" for the
    # placement bundles {"CPU": 3, "<trainer.device>": 1} (one per process); gloo; sdpa attention; no padding removal
    # (flash-attn only); fp32 actor and reference compute to match the fp32 CPU engine; the project's CPU sglang
    # engine settings (treetune_verl/sglang/engine.py:CPU_ENGINE_KWARGS) and no torch_memory_saver (CUDA only); no Ray
    # dashboard (its head and its modules are about ten processes started with every run, on two cores).
    # A cluster that already runs (RAY_ADDRESS) has its own resources: ray.init refuses to size it.
    if [[ -z "${RAY_ADDRESS:-}" ]]; then
        ARGS+=(
            ray_kwargs.ray_init.num_cpus=$((8 * NPROC))
            +ray_kwargs.ray_init.num_gpus=$NPROC
            +ray_kwargs.ray_init.include_dashboard=False
        )
        [[ "$STACK" == pinned ]] && ARGS+=("+ray_kwargs.ray_init.resources={cpu:$((4 * NPROC))}")
    fi
    ARGS+=(
        trainer.device=cpu
        actor_rollout_ref.actor.strategy=fsdp2
        actor_rollout_ref.actor.fsdp_config.dtype=float32
        actor_rollout_ref.ref.fsdp_config.dtype=float32
        actor_rollout_ref.actor.use_torch_compile=False
        actor_rollout_ref.model.use_remove_padding=False
        +actor_rollout_ref.model.override_config.attn_implementation=sdpa
        actor_rollout_ref.rollout.dtype=float32
        actor_rollout_ref.rollout.gpu_memory_utilization=0.3
        actor_rollout_ref.rollout.enforce_eager=True
        +actor_rollout_ref.rollout.engine_kwargs.sglang.device=cpu
        +actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=torch_native
        +actor_rollout_ref.rollout.engine_kwargs.sglang.sampling_backend=pytorch
        +actor_rollout_ref.rollout.engine_kwargs.sglang.grammar_backend=none
        +actor_rollout_ref.rollout.engine_kwargs.sglang.max_total_tokens=4096
        +actor_rollout_ref.rollout.engine_kwargs.sglang.max_running_requests=8
        +actor_rollout_ref.rollout.engine_kwargs.sglang.chunked_prefill_size=64
        +actor_rollout_ref.rollout.engine_kwargs.sglang.sleep_on_idle=True
        +actor_rollout_ref.rollout.engine_kwargs.sglang.enable_memory_saver=False
    )
    if [[ "$STACK" == current ]]; then
        # verl 0.9.1 (treetune_specs/2026-11-24-current-stack-trainer.md): the `cpu` platform of
        # tools/cpu_shims/verl_cpu/cpu_platform.py makes the bundles {"CPU": 1}, so no custom resource; 8 CPUs per
        # process leave room for TransferQueue's storage units (num_cpus=1 each, 8 by default: one is enough here);
        # FSDP's mixed precision is bf16 unless given (transformer_impl.py), whatever fsdp_config.dtype says, for the
        # actor and the reference model alike (a bf16 reference gives a KL of ~2e-4 at step 1); sglang
        # 0.5.12's piecewise CUDA graph runner needs torch.cuda (treetune_verl/sglang/engine.py:cpu_engine_kwargs).
        ARGS+=(
            transfer_queue.backend.SimpleStorage.num_data_storage_units=1
            '++actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
            '++actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}'
            +actor_rollout_ref.rollout.engine_kwargs.sglang.disable_piecewise_cuda_graph=True
        )
    fi
else
    ARGS+=(actor_rollout_ref.rollout.gpu_memory_utilization=0.4)
fi

# What the run's Ray processes read from this script's environment goes through Ray's runtime environment as well:
# a driver that joins a running cluster (RAY_ADDRESS, as `ray job submit` users run verl) does not pass its own
# environment to raylets started from theirs (verl's file logger reads VERL_FILE_LOGGER_PATH in the TaskRunner, which
# runs on the cluster). On several machines these paths must be on a filesystem the TaskRunner's node shares.
METRICS="$WORK/metrics.jsonl"
PROBE_DIR="$WORK/probe"
ARGS+=(
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$METRICS"
    "+ray_kwargs.ray_init.runtime_env.env_vars.TREETUNE_E2E_PROBE_DIR=$PROBE_DIR"
)
if [[ "$BLOCK" == 1 ]]; then
    ARGS+=("${ENTROPY_OVERRIDES[@]}")
    [[ "$STACK" == current ]] && ARGS+=(actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup)
else
    # Stock verl: what the block would set that the run cannot do without (see the header), nothing else.
    ARGS+=(actor_rollout_ref.rollout.name=sglang actor_rollout_ref.rollout.calculate_log_probs=True)
fi
if [[ "$PROBE" == 1 ]]; then
    ARGS+=(actor_rollout_ref.rollout.agent.agent_loop_manager_class=treetune_tests.e2e.e2e_probe.ProbedEntropyAgentLoopManager)
fi
# Forking tokens (E2E_PG_TOKEN_QUANTILE=<q>, e.g. 0.2): the policy gradient only on the top q share of tokens by
# rollout entropy (custom.entropy.pg_token_quantile); check_metrics --pg-token-quantile checks the kept share.
PG_TOKEN_QUANTILE=${E2E_PG_TOKEN_QUANTILE:-}
if [[ -n "$PG_TOKEN_QUANTILE" ]]; then
    [[ "$BLOCK" == 1 ]] || { echo "E2E_PG_TOKEN_QUANTILE needs the override block (E2E_BLOCK=1)" >&2; exit 2; }
    ARGS+=(actor_rollout_ref.rollout.custom.entropy.pg_token_quantile="$PG_TOKEN_QUANTILE")
fi
# Entropy advantage shaping (E2E_SHAPING_ALPHA=<alpha>, e.g. 0.4): each token's advantage plus an entropy bonus
# (custom.entropy.advantage_shaping.alpha, kappa its default); check_metrics --shaping checks its metrics.
SHAPING_ALPHA=${E2E_SHAPING_ALPHA:-}
if [[ -n "$SHAPING_ALPHA" ]]; then
    [[ "$BLOCK" == 1 ]] || { echo "E2E_SHAPING_ALPHA needs the override block (E2E_BLOCK=1)" >&2; exit 2; }
    ARGS+=(actor_rollout_ref.rollout.custom.entropy.advantage_shaping.alpha="$SHAPING_ALPHA")
fi
if [[ "$OVER_SAMPLE" != 0 ]]; then
    ARGS+=(
        actor_rollout_ref.rollout.over_sample_rate="$OVER_SAMPLE"
        actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup
    )
    # verl 0.9.1: over-sampling is our replay buffer (treetune_verl/verl/v0_9_1/over_sample_sampler.py)
    [[ "$STACK" == current ]] && ARGS+=(
        trainer.v1.sampler.custom_sampler.path=pkg://treetune_verl.verl.v0_9_1.over_sample_sampler
        trainer.v1.sampler.custom_sampler.name=OverSampleReplayBuffer
    )
fi
if [[ "$CARRY_OVER" == 1 ]]; then
    ARGS+=(
        +actor_rollout_ref.rollout.custom.over_sample.carry_over=true
        algorithm.rollout_correction.rollout_is=token
    )
    # verl 0.9.1: the carried groups take slots of the next step, the others are fresh prompts, fetched one at a time
    [[ "$STACK" == current ]] && ARGS+=(data.gen_batch_size=1)
fi
# Live entropy forecast (E2E_FORECAST=<k>): the +treetune_forecast=entropy_forecast block with every=k (its
# external_lib, the one actor entry point, also installs the loss fix over-sampling needs); check_metrics --forecast-every k checks its
# keys at the probed steps, and $WORK/entropy_forecast.png plots forecast vs realised (treetune_verl/forecast).
FORECAST=${E2E_FORECAST:-}
if [[ -n "$FORECAST" ]]; then
    [[ "$BLOCK" == 1 ]] || ARGS+=("hydra.searchpath=[pkg://treetune_verl.config]")
    ARGS+=(
        +treetune_forecast=entropy_forecast
        actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup
        actor_rollout_ref.rollout.custom.entropy_forecast.every="$FORECAST"
    )
fi
ARGS+=("$@")

if [[ "$PRINT_ARGS" == 1 ]]; then
    printf '%s\n' "${ARGS[@]}"
    exit 0
fi

if [[ "$DEVICE" == cpu ]]; then
    export TREETUNE_VERL_CPU_PATCHES=1
    if [[ "$STACK" == current ]]; then
        # verl 0.9.1: the `cpu` platform the patches register (verl/plugin/platform), and its FSDP engine, which verl
        # registers for cuda/npu only (verl/workers/engine/base.py:get_engine_cls reads this override).
        export VERL_PLATFORM=cpu VERL_ENGINE_DEVICE=cuda
    fi
    # async_sglang_server.py reads it (KeyError when unset) and Ray accepts the declared GPU with it; torch still sees
    # no CUDA on this machine.
    # One id per declared GPU (Ray refuses fewer visible ids than num_gpus).
    CUDA_VISIBLE_DEVICES=$(seq -s , 0 $((NPROC - 1)))
    export CUDA_VISIBLE_DEVICES
    if ! "$PYTHON" -c 'import sys, verl_cpu.hook as h; sys.exit(0 if h.installed() else 1)'; then
        echo "FAIL: the CPU patches (tools/cpu_shims/verl_cpu) are not installed in this venv: run make setup" >&2
        exit 1
    fi
fi
export RAY_TMPDIR=${RAY_TMPDIR:-/tmp/treetune_e2e_ray}
export VERL_FILE_LOGGER_PATH="$METRICS"
export TREETUNE_E2E_PROBE_DIR="$PROBE_DIR"
rm -rf "$TREETUNE_E2E_PROBE_DIR" "$VERL_FILE_LOGGER_PATH" "$WORK/summary.json" "$WORK/validation"
mkdir -p "$RAY_TMPDIR"
# Checkpoints: base and full start from scratch (resume_mode=disable; stale checkpoints removed), resume from a copy
# of E2E_RESUME_FROM's, so that the saved run stays as it was.
rm -rf "$WORK/checkpoints"
[[ "$VARIANT" == resume ]] && cp -a "$RESUME_FROM/checkpoints" "$WORK/checkpoints"

"$PYTHON" -m treetune_tests.e2e.arithmetic_data "$WORK" --train 16 --val 4

# The trainer runs in a session of its own: Ray's GCS, raylet and workers and sglang's scheduler processes all stay
# in it, so after the run (or on Ctrl-C / a test timeout) exactly what this run started can be ended, by pid.
end_session() {
    local sid=$1 pids
    for signal in TERM KILL; do
        pids=$(ps -eo pid=,sid= | awk -v sid="$sid" '$2 == sid {print $1}')
        [[ -z "$pids" ]] && return 0
        echo "[e2e] SIG${signal} to what is left in the trainer's session $sid: $(ps -o comm= -p "${pids//$'\n'/,}" | sort | uniq -c | xargs)" >&2
        kill -s "$signal" $pids 2> /dev/null || true
        sleep 3
    done
}

echo "[e2e] device=$DEVICE model=$MODEL_PATH steps=$STEPS workdir=$WORK"
status=0
setsid "$PYTHON" -m verl.trainer.main_ppo "${ARGS[@]}" > "$WORK/train.log" 2>&1 &
TRAINER=$!
echo "[e2e] trainer session: $TRAINER"
trap 'end_session "$TRAINER"; exit 130' INT TERM
# If this script is killed outright (SIGKILL: e.g. a test's timeout), the watchdog ends the trainer's session.
(
    trap '' INT TERM
    while kill -0 $$ 2> /dev/null; do sleep 2; done
    end_session "$TRAINER"
) > /dev/null 2>&1 &
wait "$TRAINER" || status=$?
trap - INT TERM
end_session "$TRAINER"
if [[ $status != 0 ]]; then
    tail -n 60 "$WORK/train.log" >&2
    echo "FAIL: verl.trainer.main_ppo exited with $status (log: $WORK/train.log)" >&2
    exit "$status"
fi

# Bounds on verl's rollout-vs-actor probability metrics at every step. On CPU both sides compute in fp32 and agree to
# ~2e-7 (mean |dp|) with Pearson 1.0, while a run whose per-step weight sync was dropped (negative control in
# treetune_specs/2026-11-23-grpo-e2e.md) showed 0.03 / 0.987 at step 2. On GPU (bf16) no default: not measured yet.
# The same for the rollout-vs-actor entropy of the same tokens (rollout_entropy/actor_abs_diff/mean, logged by the
# package's trainer hook when the two describe the same distribution: the default raw mode at temperature 1): ~1e-6
# nats measured on CPU (fp32 both sides). Empty disables it (e.g. for a top-k run, where the metric is not logged).
# Carry-over trains tokens sampled by earlier weights: verl's rollout-vs-actor probability metrics include them, so no
# bound by default (our entropy agreement leaves them out and keeps its bound).
if [[ "$CARRY_OVER" == 1 ]]; then
    E2E_MAX_PROBS_DIFF=${E2E_MAX_PROBS_DIFF-}
    E2E_MIN_PEARSON=${E2E_MIN_PEARSON-}
fi
if [[ "$DEVICE" == cpu ]]; then
    E2E_MAX_PROBS_DIFF=${E2E_MAX_PROBS_DIFF-1e-3}
    E2E_MIN_PEARSON=${E2E_MIN_PEARSON-0.999}
    E2E_MAX_ENTROPY_DIFF=${E2E_MAX_ENTROPY_DIFF-1e-3}
fi
CHECK=(--min-steps $((STEPS - FIRST_STEP + 1)) --first-step "$FIRST_STEP" --json "$WORK/summary.json")
[[ "$VARIANT" != base ]] && CHECK+=(--kl --val)
# resume: its validation before training (the loaded weights, greedy) must reproduce the saved run's validation of the
# saved step (the weights it saved) token for token.
[[ "$VARIANT" == resume ]] && CHECK+=(--same-generations "$RESUME_FROM/validation/$((FIRST_STEP - 1)).jsonl" \
    "$WORK/validation/$((FIRST_STEP - 1)).jsonl")
[[ -n "${E2E_MAX_PROBS_DIFF:-}" ]] && CHECK+=(--max-probs-diff "$E2E_MAX_PROBS_DIFF")
[[ -n "${E2E_MIN_PEARSON:-}" ]] && CHECK+=(--min-pearson "$E2E_MIN_PEARSON")
if [[ "$BLOCK" == 1 ]]; then
    [[ -n "${E2E_MAX_ENTROPY_DIFF:-}" ]] && CHECK+=(--max-entropy-diff "$E2E_MAX_ENTROPY_DIFF")
else
    CHECK+=(--no-entropy)
fi
if [[ "$OVER_SAMPLE" != 0 ]]; then
    CHECK+=(--aborted-ratio "$("$PYTHON" -c "from treetune_verl.trainer.features import completion_target as t
g = $TRAIN_BATCH_SIZE; print((g - t($OVER_SAMPLE, g)) / g)")")  # whole groups: the share of groups aborted
fi
[[ "$CARRY_OVER" == 1 ]] && CHECK+=(--carry-over)
[[ -n "$PG_TOKEN_QUANTILE" ]] && CHECK+=(--pg-token-quantile "$PG_TOKEN_QUANTILE")
[[ -n "$SHAPING_ALPHA" ]] && CHECK+=(--shaping)
[[ -n "$FORECAST" ]] && CHECK+=(--forecast-every "$FORECAST")
"$PYTHON" -m treetune_tests.e2e.check_metrics "$VERL_FILE_LOGGER_PATH" "${CHECK[@]}"
[[ -n "$FORECAST" ]] && "$PYTHON" -m treetune_verl.forecast.plot "$VERL_FILE_LOGGER_PATH"

if [[ "$PROBE" == 1 ]]; then
    "$PYTHON" - "$TREETUNE_E2E_PROBE_DIR" $((TRAIN_BATCH_SIZE * ROLLOUT_N)) <<'EOF'
import json
import pathlib
import sys

probe_dir, batch_size = pathlib.Path(sys.argv[1]), int(sys.argv[2])
records = sorted(probe_dir.glob("rollout_*.json"))
assert records, f"no rollout reached the probe in {probe_dir}"
for path in records:
    record = json.loads(path.read_text())
    assert record["shape"] == [batch_size, record["response_length"]], (path.name, record)
    assert record["dtype"] == "torch.float32" and record["finite"], record
    assert record["model_tokens"] > 0 and record["nonzero_off_mask"] == 0 and record["zero_on_mask"] == 0, record
    assert not any("entropy" in key for key in record["non_tensor_keys"]), record
    assert set(record["metrics"]) == {f"agent_loop/rollout_entropy/{k}" for k in ("mean", "p50", "p90", "max")}
print(f"OK: {len(records)} rollout(s) with rollout_entropy [{batch_size}, response_length] float32")
EOF
fi
