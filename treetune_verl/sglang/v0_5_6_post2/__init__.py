# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sglang 0.5.6.post2 adapter: how entropy gets into that version's scheduler process and out of it.

sglang 0.5.6.post2 has no plugin seam, so ``launch.install`` injects our own spawn entry point
(``scheduler_process``), which applies ``scheduler_patches`` (the ``EntropySampler``, result-handler pre-hooks, the
senders that fill ``output_token_entropy_val`` from an ``EntropyStore``) in the child. Shared with the other
version: the formula (``sglang/entropy.py``), the configuration (``config.py``), the TokenizerManager side
(``tokenizer_patches.py``) and the refusals (``server_args.py``).
"""
