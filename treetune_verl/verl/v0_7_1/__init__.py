# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's adapter (the pinned stack): its modules are picked by ``treetune_verl.verl.adapter``."""
