# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""How the e2e tests run ``test_entropy_e2e.sh``: with only the ``E2E_*`` / ``MODEL_PATH`` settings they pass."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "treetune_tests" / "e2e" / "test_entropy_e2e.sh"


def kept_workdir(name: str) -> Path:
    """Where an e2e test keeps a run's outputs for a look afterwards: ``outputs/e2e-test-<name>/verl-<version>/``, one
    folder per stack, since ``make test`` runs both stacks' suites side by side."""
    import importlib.metadata

    return REPO_ROOT / "outputs" / f"e2e-test-{name}" / f"verl-{importlib.metadata.version('verl')}"


def run_script(env: dict[str, str], *args: str, timeout: int) -> subprocess.CompletedProcess:
    """The script with ``env`` on top of this process's environment minus its ``E2E_*`` / ``MODEL_PATH`` settings;
    ``args`` are Hydra overrides appended to the run's."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("E2E_") and k != "MODEL_PATH"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**base, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_training(env: dict[str, str], *args: str, timeout: int) -> subprocess.CompletedProcess:
    """:func:`run_script` (``args``: Hydra overrides) for a run that trains: it exits 0 (else the output's tail and the log's path in the message)
    and no process of the trainer's session is left (``[e2e] trainer session: <sid>``, exactly one: the script ends
    the whole session, Ray and sglang's schedulers included)."""
    result = run_script(env, *args, timeout=timeout)
    log = Path(env.get("E2E_WORKDIR", REPO_ROOT / "outputs" / "e2e")) / "train.log"
    assert result.returncode == 0, (
        f"e2e run failed (rc {result.returncode}, {env}); log: {log}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    sessions = {int(m) for m in re.findall(r"^\[e2e\] trainer session: (\d+)$", result.stdout, re.M)}
    alive = {
        int(x) for x in subprocess.run(["ps", "-eo", "sid="], capture_output=True, text=True, check=True).stdout.split()
    }
    assert len(sessions) == 1 and not sessions & alive, (sessions, sessions & alive)
    return result
