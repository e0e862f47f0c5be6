# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``python -m treetune_verl.probe [key=value ...]``: the entropy probe's main job (Hydra overrides)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from treetune_verl.probe.config import CONFIG_DIR, CONFIG_NAME
from treetune_verl.probe.job import run_probe_job


@hydra.main(config_path=str(CONFIG_DIR), config_name=CONFIG_NAME, version_base=None)
def main(cfg: DictConfig) -> None:
    run_probe_job(cfg)


if __name__ == "__main__":
    main()
