# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""E's prompts, from the ``DataProto`` verl's actor is about to train on.

Shape notation:
    N = rows of this rank's chunk (one prompt + one response each), P = prompt width, R = response width
    W = data-parallel ranks

verl's rows are ``[left pad | prompt | response | right pad]`` (``input_ids`` [N, P+R], ``responses`` [N, R]); a
prompt is identified by ``non_tensor_batch["uid"]`` (verl's GRPO group id). verl's trainer balances rows over ranks
by length, which splits groups, so every rank gathers the (uid, prompt ids) of all ranks (``all_gather_object``; ids
only), sorts the distinct prompts by uid and takes prompts ``rank, rank + W, ...`` up to the same count on every rank
(FSDP's collectives need the same number of passes everywhere; at most W - 1 prompts are left out). E's responses
are then sampled fresh (``live.py``), so that E is independent of U's responses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from verl import DataProto


@dataclass(frozen=True)
class EvalPrompts:
    """This rank's share of the batch's prompts.

    Attributes:
        prompt_ids: token ids of each prompt (no padding).
        total: distinct prompts over all ranks; ``left_out``: those beyond an equal share per rank.
    """

    prompt_ids: list[list[int]]
    total: int
    left_out: int


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _prompts(data: DataProto) -> dict[str, list[int]]:
    """uid -> prompt ids of this rank's rows."""
    if "uid" not in data.non_tensor_batch:
        raise ValueError(
            "entropy forecast: the actor's batch has no non_tensor_batch['uid'] (verl's prompt-group id), so its "
            "prompts cannot be told apart"
        )
    R = data.batch["responses"].shape[1]
    input_ids = data.batch["input_ids"][:, :-R]
    prompt_mask = data.batch["attention_mask"][:, :-R].bool()
    return {str(uid): input_ids[i][prompt_mask[i]].tolist() for i, uid in enumerate(data.non_tensor_batch["uid"])}


def eval_prompts(data: DataProto) -> EvalPrompts:
    """This rank's share of the distinct prompts of the global batch (the same count on every rank).

    Raises:
        ValueError: no ``uid``, or fewer distinct prompts than data-parallel ranks.
    """
    rank, size = world()
    prompts = _prompts(data)
    if size > 1:
        gathered: list[dict[str, list[int]]] = [None] * size  # type: ignore[list-item]
        torch.distributed.all_gather_object(gathered, prompts)
        prompts = {uid: ids for part in gathered for uid, ids in part.items()}
    uids = sorted(prompts)
    share = len(uids) // size
    if share == 0:
        raise ValueError(
            f"entropy forecast: {len(uids)} distinct prompts for {size} data-parallel ranks; each needs one"
        )
    return EvalPrompts([prompts[uid] for uid in uids[rank::size][:share]], len(uids), len(uids) - share * size)
