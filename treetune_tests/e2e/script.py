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


def assert_trainer_session_ended(stdout: str) -> None:
    """The script named exactly one trainer session (``[e2e] trainer session: <sid>``) and no process of it is left
    (the script ends the trainer's whole session: Ray, sglang's schedulers)."""
    sessions = {int(m) for m in re.findall(r"^\[e2e\] trainer session: (\d+)$", stdout, re.M)}
    alive = {
        int(x) for x in subprocess.run(["ps", "-eo", "sid="], capture_output=True, text=True, check=True).stdout.split()
    }
    assert len(sessions) == 1 and not sessions & alive, (sessions, sessions & alive)
