# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""A small built-in arithmetic prompt set in verl's RLHFDataset parquet format, for the e2e GRPO run.

Each row: ``data_source``, a chat ``prompt`` (one user message), ``ability``, ``reward_model.ground_truth`` (the
answer as a string) and ``extra_info`` (split, index, the two operands). Deterministic (no randomness), so every run
trains on the same prompts.

    python -m treetune_tests.e2e.arithmetic_data OUT_DIR [--train 16] [--val 4]   # writes train.parquet, val.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

DATA_SOURCE = "treetune/arithmetic"
INSTRUCTION = "Give the final answer after '####'."


def rows(split: str, count: int) -> list[dict]:
    offset = 0 if split == "train" else 1000
    out = []
    for index in range(count):
        a, b = 3 + (7 * (index + offset)) % 41, 2 + (5 * (index + offset)) % 23
        op, answer = ("+", a + b) if index % 2 == 0 else ("-", a - b)
        question = f"What is {a} {op} {b}? {INSTRUCTION}"
        out.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": index, "a": a, "b": b, "op": op},
            }
        )
    return out


def write_parquet(out_dir: Path, train: int = 16, val: int = 4) -> tuple[Path, Path]:
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "train.parquet", out_dir / "val.parquet"
    for path, (split, count) in zip(paths, (("train", train), ("val", val)), strict=True):
        pd.DataFrame(rows(split, count)).to_parquet(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--train", type=int, default=16)
    parser.add_argument("--val", type=int, default=4)
    args = parser.parse_args()
    for path in write_parquet(args.out_dir, args.train, args.val):
        print(path)


if __name__ == "__main__":
    main()
