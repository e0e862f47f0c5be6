# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Entropy control from the forecast (issue 46): before an actor update, how much of the entropy's own step to mix
into it so that the predicted entropy after it stays in a band.

- ``rule``: the decision of one update from the forecast's figures (:func:`rule.choose_coefficient`), with its
  fallback when the forecast cannot tell;
- ``settings``: ``custom.entropy_control``;
- ``adam_sensitivity``: the optimizer's step differentiated with respect to an added gradient (the entropy step);
- ``sensitivity``: the entropy step from half of E and what it does to the other half (``b``, slope and secant);
- ``controller``: the three above inside the forecast's first optimizer step (``Controller``, ``attach``).

Spec: ``treetune_specs/2026-11-28-entropy-controller.md``. Importing this package imports nothing of verl or sglang (its modules import torch and the probe).
"""
