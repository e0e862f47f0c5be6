# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sglang 0.5.12 adapter: entropy through sglang's own plugin seam and its ``customized_info`` channel.

sglang 0.5.12 calls ``load_plugins()`` as the first line of every scheduler process and in the parent's Engine, so
no entry point of ours is injected: ``treetune_verl.sglang.plugin:load`` (registered under ``sglang.srt.plugins`` in
``pyproject.toml``, inert unless ``TREETUNE_ENTROPY=1``) applies ``scheduler_hooks`` in the child, and
``launch.install`` applies ``tokenizer_hooks`` in the parent. Along the path, one batch step:

1. ``scheduler_hooks``: ``Sampler.forward`` puts ``[bs]`` entropies into ``logits_output.customized_info``, which
   sglang itself copies onto each ``Req`` (one value per generated token), slices per output and carries through
   the detokenizer to the TokenizerManager.
2. ``tokenizer_hooks``: ``TokenizerManager._handle_batch_output`` moves our key from ``customized_info`` into the
   output's ``output_token_entropy_val`` (sglang's field, hard-coded ``None`` upstream), where the shared
   ``tokenizer_patches`` read it as on 0.5.6.post2.

Shared with 0.5.6.post2: the formula (``sglang/entropy.py``), the configuration (``config.py``), the TokenizerManager
patches (``tokenizer_patches.py``) and the refusals (``server_args.py``).
"""
