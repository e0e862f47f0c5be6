# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sglang side: per-token sampling entropy from sglang 0.5.6.post2, knowing nothing of verl.

Along the entropy's path: ``entropy`` (the formula) and ``config`` (top-k, mode, crossing the spawn boundary) ->
``sampler`` (computes it from the step's raw logits) -> ``scheduler_patches`` with ``store`` (record per request,
send with each output) -> ``tokenizer_patches`` (``meta_info["output_token_entropy"]``). ``engine.install`` turns it
all on (``scheduler_process`` is the spawned entry point; ``server_args`` refuses unsupported settings; ``patching``
guards every patch). ``generate``/``report``: deprecated aliases of ``treetune_verl.generation.quick_run`` /
``records`` / ``heatmap`` (one release). Spec: ``treetune_specs/2026-11-22-sglang-entropy-extraction.md``; map: ``agent-docs/architecture.md``.
"""
