# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""E as the rollout hands it to the actor, made up for the forecast's tests and benches: ``EvalResponses`` of given
prompts with responses from a generator of their own (never the batch's responses U)."""

from __future__ import annotations

import numpy as np
import torch

from treetune_verl.forecast.rollout_eval import EvalResponses


def given_eval(
    uids: list[str],
    prompt_ids: list[torch.Tensor],
    n: int,
    vocab: int,
    budget: int,
    seed: int,
    full_budget: bool = False,
    low: int = 2,
) -> EvalResponses:
    """``n`` responses for each prompt (``prompt_ids[b]`` of ``uids[b]``): token ids in ``[low, vocab)``, lengths
    uniform in 1..``budget`` (drawn first), or all ``budget`` long with ``full_budget`` (the most a forward over E
    costs); request keys ``forecast-eval-<b>-<g>``. The same on every rank for the same arguments."""
    gen = torch.Generator().manual_seed(seed)
    if full_budget:
        lengths = torch.full((len(uids), n), budget)
    else:
        lengths = torch.randint(1, budget + 1, (len(uids), n), generator=gen)
    responses = [
        [torch.randint(low, vocab, (int(length),), generator=gen).numpy().astype(np.int32) for length in row]
        for row in lengths
    ]
    request_ids = [[f"forecast-eval-{b}-{g}" for g in range(n)] for b in range(len(uids))]
    prompts = [torch.as_tensor(p).numpy().astype(np.int32) for p in prompt_ids]
    return EvalResponses(list(uids), prompts, responses, budget, request_ids)
