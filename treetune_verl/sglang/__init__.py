# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sglang side: per-token sampling entropy from sglang 0.5.6.post2 and 0.5.12, knowing nothing of verl.

Along the entropy's path: ``entropy`` (the formula) and ``config`` (top-k, mode, crossing the spawn boundary) ->
the version's adapter in the scheduler process (``v0_5_6_post2/``: ``sampler``'s ``EntropySampler``,
``scheduler_patches`` with ``store``, our spawned entry point ``scheduler_process``; ``v0_5_12/``: sglang's plugin
seam, ``plugin`` -> ``scheduler_hooks`` into sglang's ``customized_info`` -> ``tokenizer_hooks``) ->
``tokenizer_patches`` (``meta_info["output_token_entropy"]``, both versions). ``engine.install`` turns it all on
(``server_args`` refuses unsupported settings; ``patching`` guards every patch). Specs:
``treetune_specs/2026-11-22-sglang-entropy-extraction.md``, ``2026-11-24-current-stack-engine.md``; map:
``agent-docs/architecture.md``.
"""
