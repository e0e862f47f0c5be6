# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Main job: generate with a patched sglang Engine and show the per-token sampling entropy.

    python -m treetune_verl.generation.quick_run                  # SmolLM2-135M-Instruct, built-in prompts (make run)
    python -m treetune_verl.generation.quick_run --top-k 20 --mode tempered --temperature 0.7
    python -m treetune_verl.generation.quick_run --model /path/to/hf_model --prompts prompts.txt

Prints one row per response (tokens, mean / p90 / max entropy in nats) and writes
``<out-dir>/responses.jsonl`` (token ids, text pieces, logprobs, entropies) and ``<out-dir>/entropy.html``
(each token shaded by its entropy). Runs on CPU with the CPU setup, and unchanged on a CUDA machine. Records and
table: :mod:`treetune_verl.generation.records`; page: :mod:`treetune_verl.generation.heatmap`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import warnings
from pathlib import Path

from treetune_verl.generation.heatmap import render_html
from treetune_verl.generation.records import format_table, record_from_output, write_jsonl
from treetune_verl.sglang.config import ENTROPY_MODES

BUILTIN_PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for staying focused while studying.",
    "Write a haiku about the ocean.",
    "What is 12 times 7? Explain briefly.",
    "Name a programming language and say one thing it is good at.",
    "Tell me a fun fact about octopuses.",
]


# Notices sglang 0.5.6.post2 prints on every CPU start, in the parent and again in each spawned process, that say
# nothing about the run: (message prefix, the exact module that warns). Each is matched by both, so any other
# warning, and every error, still shows.
_KNOWN_NOTICES = (
    ("Only CUDA", "sglang.srt.layers.quantization.awq"),  # quantization methods we do not use (AWQ, GGUF)
    ("Only CUDA", "sglang.srt.layers.quantization.gguf"),
    ("Triton is not supported on current platform", "sglang.srt.layers.attention.fla.utils"),
)
# Logged by sglang's server_args at WARNING although CPU_ENGINE_KWARGS asks for exactly this.
_EXPECTED_LOG = ("sglang.srt.server_args", "Cuda graph is disabled because of using torch native attention backend")


def _drop_expected_log(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_EXPECTED_LOG[1])


def quiet_known_notices() -> None:
    """Filter the known start-up notices at their source (this process and, through ``PYTHONWARNINGS``, sglang's
    spawned scheduler and detokenizer), before sglang is imported. Idempotent."""
    options = [f"ignore:{message}:UserWarning:{module}" for message, module in _KNOWN_NOTICES]
    for message, module in _KNOWN_NOTICES:
        warnings.filterwarnings("ignore", message=message, category=UserWarning, module=module.replace(".", r"\."))
    present = [o for o in os.environ.get("PYTHONWARNINGS", "").split(",") if o]
    os.environ["PYTHONWARNINGS"] = ",".join(present + [o for o in options if o not in present])
    logger = logging.getLogger(_EXPECTED_LOG[0])
    if _drop_expected_log not in logger.filters:
        logger.addFilter(_drop_expected_log)


def load_prompts(path: str | None) -> list[str]:
    """Prompts from a ``.json`` list or a text file (one prompt per non-empty line); built-ins by default."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    text = Path(path).read_text(encoding="utf-8")
    prompts = json.loads(text) if path.endswith(".json") else [line for line in text.splitlines() if line.strip()]
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise SystemExit(f"--prompts {path}: expected a non-empty list of strings")
    return prompts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="HF model folder (default: packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--prompts", default=None, help="text file (one per line) or .json list of prompts")
    parser.add_argument("--top-k", type=int, default=0, help="entropy over the top-k logits (0 = full vocabulary)")
    parser.add_argument("--mode", choices=ENTROPY_MODES, default="raw", help="raw: before temperature; tempered: at T")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="outputs/generate")
    args = parser.parse_args(argv)
    if args.top_k < 0:
        parser.error(f"--top-k must be >= 0, got {args.top_k}")
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    quiet_known_notices()
    import sglang
    from transformers import AutoTokenizer

    from treetune_verl.model_cache import smollm2_path
    from treetune_verl.sglang.engine import engine_kwargs, install

    model = args.model or str(smollm2_path())
    prompts = load_prompts(args.prompts)
    tokenizer = AutoTokenizer.from_pretrained(model)
    # Token ids from this tokenizer, not text: sglang 0.5.12 may load another tokenizer class for the same folder
    # (it retries transformers 5's generic TokenizersBackend as a slow tokenizer), which splits text differently.
    prompt_ids = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if tokenizer.chat_template
        else tokenizer(p)["input_ids"]
        for p in prompts
    ]
    install(top_k=args.top_k, mode=args.mode)
    start = time.perf_counter()
    engine = sglang.Engine(**engine_kwargs(model, args.device, random_seed=args.seed, log_level="error"))
    try:
        outputs = engine.generate(
            input_ids=prompt_ids,
            sampling_params={
                "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature,
                "top_p": args.top_p,
            },
            return_logprob=True,
        )
    finally:
        engine.shutdown()
    elapsed = time.perf_counter() - start

    records = [record_from_output(p, o, lambda t: tokenizer.decode([t])) for p, o in zip(prompts, outputs, strict=True)]
    out_dir = Path(args.out_dir)
    write_jsonl(records, out_dir / "responses.jsonl")
    (out_dir / "entropy.html").write_text(
        render_html(
            records, title=f"Per-token entropy ({args.mode}, top-k={args.top_k or 'full'}) — {Path(model).name}"
        ),
        encoding="utf-8",
    )
    print(f"model: {model}\nentropy: mode={args.mode} top_k={args.top_k or 'full vocabulary'} (nats)")
    print(format_table(records))
    print(f"\n{len(records)} responses in {elapsed:.1f} s (engine start included)")
    print(f"wrote {out_dir / 'responses.jsonl'} and {out_dir / 'entropy.html'}")
    return records


if __name__ == "__main__":
    main()
