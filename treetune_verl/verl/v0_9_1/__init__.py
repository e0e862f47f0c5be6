# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1's adapter (the current stack): its modules are picked by ``treetune_verl.verl.adapter``."""
