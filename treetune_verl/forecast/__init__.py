# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Live entropy forecast inside verl's actor: the probe's ΔH₁ of the update's first optimizer step beside the
realised entropy change (treetune_specs/2026-11-23-live-entropy-forecast.md).

Enable with ``hydra.searchpath=[pkg://treetune_verl.config] +treetune_forecast=entropy_forecast`` (the block sets
``actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup`` and
``actor_rollout_ref.rollout.custom.entropy_forecast``).
"""
