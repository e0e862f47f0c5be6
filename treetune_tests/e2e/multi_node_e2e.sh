#!/usr/bin/env bash
# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
#
# `make e2e` on a Ray cluster that already runs, as `ray job submit` users run verl: two raylets on this machine
# (a head and a worker node), each started from a clean environment (`env -i`: only what the CPU harness needs, none
# of the e2e script's variables), then the e2e script joins them through RAY_ADDRESS with one training process per
# node (E2E_NPROC=2 E2E_NNODES=2) and checks the metrics file verl's file logger wrote from the cluster's TaskRunner.
# The cluster is stopped on exit, whatever happened, and nothing else: its processes are ended by their session id.
#
#   bash treetune_tests/e2e/multi_node_e2e.sh                      # pinned stack (.venv), tiny model, 2 steps
#   PYTHON=.venv-current/bin/python bash treetune_tests/e2e/multi_node_e2e.sh
#   make e2e-multi-node [STACK=current]
#
# Env: PYTHON (default .venv/bin/python), E2E_MODEL (default tiny), E2E_STEPS (default 2), RAY_PORT (default 6391),
# E2E_WORKDIR (default outputs/e2e-multi-node). Extra arguments go to the e2e script (Hydra overrides).
# Ray's token authentication (on by default in the installed Ray) refuses the second raylet: RAY_AUTH_MODE=disabled.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
BIN=$(dirname "$PYTHON")
PORT=${RAY_PORT:-6391}
export RAY_TMPDIR=${RAY_TMPDIR:-/tmp/treetune_mn_ray}  # short: Ray's socket paths have a length limit
export RAY_AUTH_MODE=disabled
WORK=${E2E_WORKDIR:-$ROOT/outputs/e2e-multi-node}

case "$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("verl"))')" in
    0.7.1) STACK=pinned RESOURCES=(--resources='{"cpu":4}') ;;
    0.9.1) STACK=current RESOURCES=() ;;
    *) echo "FAIL: $PYTHON has neither verl 0.7.1 nor 0.9.1" >&2; exit 1 ;;
esac
# What a node of this CPU harness needs in its own environment (the e2e script's CPU settings, read at interpreter
# start by tools/cpu_shims); one declared GPU per node.
NODE_ENV=(
    PATH=/usr/bin:/bin HOME="$HOME" RAY_AUTH_MODE=disabled TREETUNE_VERL_CPU_PATCHES=1 CUDA_VISIBLE_DEVICES=0
    HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$ROOT"
    TREETUNE_CACHE_DIR="${TREETUNE_CACHE_DIR:-$ROOT/.cache}" HF_HOME="${HF_HOME:-$ROOT/.cache/hf}"
)
[[ "$STACK" == current ]] && NODE_ENV+=(VERL_PLATFORM=cpu VERL_ENGINE_DEVICE=cuda)

# The two nodes start in a session of their own: every process of the cluster (GCS, raylets, agents, workers) stays in
# it and is ended by that session id. Not `ray stop`, which ends every Ray process on the machine (another run's too).
CLUSTER_SID=""
stop_cluster() {
    [[ -z "$CLUSTER_SID" ]] && return 0
    local pids
    for signal in TERM KILL; do
        pids=$(ps -eo pid=,sid= | awk -v sid="$CLUSTER_SID" '$2 == sid {print $1}')
        [[ -z "$pids" ]] && return 0
        kill -s "$signal" $pids 2> /dev/null || true
        sleep 3
    done
}
trap stop_cluster EXIT
mkdir -p "$RAY_TMPDIR"
SID_FILE="$RAY_TMPDIR/cluster.sid"
rm -f "$SID_FILE"
setsid -w env -i "${NODE_ENV[@]}" BIN="$BIN" PORT="$PORT" TMP="$RAY_TMPDIR" SID_FILE="$SID_FILE" RESOURCES="${RESOURCES[*]}" \
    bash -c 'echo $$ > "$SID_FILE"
        "$BIN/ray" start --head --port="$PORT" --num-cpus=8 --num-gpus=1 $RESOURCES --include-dashboard=false \
            --temp-dir="$TMP" --disable-usage-stats > /dev/null
        "$BIN/ray" start --address="127.0.0.1:$PORT" --num-cpus=8 --num-gpus=1 $RESOURCES --disable-usage-stats \
            > /dev/null' < /dev/null
CLUSTER_SID=$(cat "$SID_FILE")
nodes=$(env -i "${NODE_ENV[@]}" RAY_ADDRESS="127.0.0.1:$PORT" "$PYTHON" -c \
    'import ray; ray.init(); print(sum(n["Alive"] for n in ray.nodes()))' 2> /dev/null)
echo "[multi-node] $STACK stack: a Ray cluster of $nodes nodes at 127.0.0.1:$PORT"
[[ "$nodes" == 2 ]] || { echo "FAIL: expected 2 live nodes, got $nodes" >&2; exit 1; }

rm -f "$WORK/metrics.jsonl"
RAY_ADDRESS="127.0.0.1:$PORT" PYTHON="$PYTHON" E2E_DEVICE=cpu E2E_MODEL="${E2E_MODEL:-tiny}" \
    E2E_STEPS="${E2E_STEPS:-2}" E2E_NPROC=2 E2E_NNODES=2 E2E_WORKDIR="$WORK" \
    bash treetune_tests/e2e/test_entropy_e2e.sh "$@"
steps=$(wc -l < "$WORK/metrics.jsonl")
echo "[multi-node] $STACK stack: $WORK/metrics.jsonl written from the cluster ($steps steps)"
