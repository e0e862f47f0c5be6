# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Importing ``treetune_verl.managed`` (as every agent-loop worker does for ``entropy_managed_agent``) does not
import sglang: ``EngineBackend`` imports it lazily."""

from __future__ import annotations

import subprocess
import sys


def test_package_imports_without_sglang_in_a_fresh_interpreter():
    check = "import sys, treetune_verl.managed; print('sglang' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "False", "importing treetune_verl.managed imported sglang"
