# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl's own ``ppo_trainer`` config composed by Hydra with the README override block, for the installed verl (0.7.1
or 0.9.1). Imports nothing of verl but its config folder, so the tests of both stacks can use it."""

from __future__ import annotations

import os
from pathlib import Path


def compose_ppo_trainer(
    model_path: Path | str, prompt_length: int, response_length: int, extra: list[str] | None = None
):
    """``ppo_trainer`` + the README block + the model and lengths, then ``extra`` overrides (they win)."""
    import verl
    from hydra import compose, initialize_config_dir

    from treetune_verl.config import read_overrides

    overrides = read_overrides() + [
        f"actor_rollout_ref.model.path={model_path}",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        *(extra or []),
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)
