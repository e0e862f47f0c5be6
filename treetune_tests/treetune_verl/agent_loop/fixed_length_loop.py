# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""A single-turn loop with deterministic response lengths on a random model, for the over-sampling tests of both
stacks (it imports nothing verl-version specific but the entropy single-turn loop)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, ClassVar

from treetune_verl.agent_loop.entropy_single_turn_agent_loop import EntropySingleTurnAgentLoop

ROW_FAILURE = "the environment of this row broke"
FIXED_LENGTH_LOOP = {"name": "fixed_length_agent", "_target_": f"{__name__}.FixedLengthAgentLoop"}


class FixedLengthAgentLoop(EntropySingleTurnAgentLoop):
    """The entropy single-turn loop, except that a prompt containing ``tokens=N`` ignores end-of-sequence tokens and
    generates exactly ``N`` tokens (at most ``response_length``): deterministic response lengths on a random model
    (only that row's sampling parameters change). Per row of a group (its rows run in one worker, started in order;
    counted per prompt in this process): ``lengths=N1/N2/...`` gives the j-th row ``N_j`` (cycling), and ``fail=j``
    makes the j-th row raise :data:`ROW_FAILURE` after its model turn (an environment that breaks mid-episode). Select
    it through an ``agent_loop_config_path`` entry (:data:`FIXED_LENGTH_LOOP`)."""

    _rows_seen: ClassVar[Counter[str]] = Counter()

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        prompt = str(kwargs["raw_prompt"])
        row, self._rows_seen[prompt] = self._rows_seen[prompt], self._rows_seen[prompt] + 1
        tokens = None
        if (per_row := re.search(r"lengths=([\d/]+)", prompt)) is not None:
            values = [int(value) for value in per_row.group(1).split("/")]
            tokens = values[row % len(values)]
        elif (fixed := re.search(r"tokens=(\d+)", prompt)) is not None:
            tokens = int(fixed.group(1))
        if tokens is not None:
            sampling_params = {**sampling_params, "ignore_eos": True, "max_new_tokens": tokens}
        output = await super().run(sampling_params, **kwargs)
        if (failing := re.search(r"fail=(\d+)", prompt)) is not None and int(failing.group(1)) == row:
            raise RuntimeError(ROW_FAILURE)
        return output
