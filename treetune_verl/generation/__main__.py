# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``python -m treetune_verl.generation [key=value ...]``: the dataset-scale generation job (Hydra overrides)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from treetune_verl.generation.config import CONFIG_DIR, CONFIG_NAME
from treetune_verl.generation.inputs import InputError
from treetune_verl.generation.job import run_generation_job


@hydra.main(config_path=str(CONFIG_DIR), config_name=CONFIG_NAME, version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        run_generation_job(cfg)
    except InputError as exc:  # a bad prompt file: the message names the row and field; no traceback
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
