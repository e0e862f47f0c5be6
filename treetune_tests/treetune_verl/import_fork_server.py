# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Import each named module alone, in a child forked from one interpreter that has only third-party packages loaded.

Run as a script in a fresh interpreter: ``python import_fork_server.py MODULE ...``; prints one JSON object
``{module: {"returncode": int, "stdout": str, "stderr": str}}``. Each child imports exactly one module, as a fresh
interpreter would, except that the heavy third-party packages in ``PRELOAD`` (torch, verl, ray, ...) are already
in ``sys.modules``: none of them is ours and none is sglang (checked before any child starts), so the import-layout
test still catches one of our modules that only imports when another of ours came first, and one that pulls in
sglang. Forking saves each child the ~3-10 s those packages cost to import on 2 cores.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import threading
import traceback

# Third-party packages nearly every module of ours imports; each is preloaded only when installed.
PRELOAD = (
    "numpy",
    "torch",
    "transformers",
    "ray",
    "tensordict",
    "datasets",
    "omegaconf",
    "hydra",
    "verl",
    "verl.experimental.agent_loop",
)
MAX_CHILDREN = (os.cpu_count() or 1) + 1


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    ours = [name for name in sys.modules if name == "treetune_verl" or name.startswith(("treetune_verl.", "sglang"))]
    if ours:
        raise RuntimeError(f"preloading third-party packages imported {ours[:5]}: the children would not be fresh")
    if threading.active_count() != 1:
        raise RuntimeError(f"preloading started {threading.active_count() - 1} threads: forking would not be safe")


def import_in_child(module: str, out_path: str, err_path: str) -> None:
    """In the forked child: stdout/stderr to files, import ``module``, report like ``python -c`` would. Never returns."""
    out_fd = os.open(out_path, os.O_WRONLY)
    err_fd = os.open(err_path, os.O_WRONLY)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    code = 0
    try:
        importlib.import_module(module)
        print("sglang" in sys.modules)
    except BaseException:  # an import that fails must be reported, whatever it raised
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(modules: list[str]) -> dict[str, dict]:
    preload()
    results: dict[str, dict] = {}
    running: dict[int, str] = {}  # child pid -> the module it imports
    pending = list(modules)
    with tempfile.TemporaryDirectory() as tmp:

        def paths(module: str) -> tuple[str, str]:
            return os.path.join(tmp, f"{module}.out"), os.path.join(tmp, f"{module}.err")

        while pending or running:
            while pending and len(running) < MAX_CHILDREN:
                module = pending.pop(0)
                for path in paths(module):
                    open(path, "w").close()
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    import_in_child(module, *paths(module))
                running[pid] = module
            pid, status = os.wait()
            module = running.pop(pid)
            out_path, err_path = paths(module)
            with open(out_path) as out, open(err_path) as err:
                results[module] = {
                    "returncode": os.waitstatus_to_exitcode(status),
                    "stdout": out.read(),
                    "stderr": err.read(),
                }
    return results


if __name__ == "__main__":
    # As under ``python -c``: the working directory first, not this file's folder (whose sglang/ would shadow sglang).
    sys.path[0] = ""
    print(json.dumps(main(sys.argv[1:])))
