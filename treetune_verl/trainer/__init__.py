# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What the trainer's side shares across verl versions; the seams themselves are in ``treetune_verl/verl/v*/``.

- ``features``: which features a run's config turns on, and the start-up refusals of how they combine.
- ``custom_keys``: the key tree of our ``rollout.custom.*`` sections, checked at start-up (a typo names its key).
- ``metrics``: the per-step metrics the seams and the agent-loop managers log.

Importing this package imports nothing (no verl): each module is imported where it is needed.
"""
