# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Entropy probe: first-order entropy change ΔH₁ = ⟨X̄, Δθ⟩ of one optimizer step, with naive and
Rao-Blackwellised estimators of the entropy gradient, and a ground-truth step. Math: treetune_specs/2026-11-22-entropy-probe.md.
"""

from treetune_verl.probe.batch import make_probe_batch, validate_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.config import resolve_config
from treetune_verl.probe.mixed_probe import run_mixed_probe
from treetune_verl.probe.optimizer_step import optimizer_step
from treetune_verl.probe.sampling import sample_responses

__all__ = [
    "optimizer_step",
    "ProbeComponents",
    "make_probe_batch",
    "resolve_config",
    "run_mixed_probe",
    "sample_responses",
    "validate_probe_batch",
]
