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

When the rollout sampled E (``rollout_eval.py``: every rank gets all of it in the batch's ``meta_info``), each rank
takes its share of E's prompts the same way (:func:`rollout_eval_share`), with their responses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from verl import DataProto

from treetune_verl.forecast.rollout_eval import EvalResponses
from treetune_verl.forecast.settings import SECTION
from treetune_verl.probe.batch import make_probe_batch


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


def prompts_by_uid(data: DataProto) -> dict[str, list[int]]:
    """uid -> prompt ids of this rank's rows of verl 0.7.1's ``DataProto``."""
    if "uid" not in data.non_tensor_batch:
        raise ValueError(
            "entropy forecast: the actor's batch has no non_tensor_batch['uid'] (verl's prompt-group id), so its "
            "prompts cannot be told apart"
        )
    R = data.batch["responses"].shape[1]
    input_ids = data.batch["input_ids"][:, :-R]
    prompt_mask = data.batch["attention_mask"][:, :-R].bool()
    return {str(uid): input_ids[i][prompt_mask[i]].tolist() for i, uid in enumerate(data.non_tensor_batch["uid"])}


def eval_prompts(prompts: dict[str, list[int]], select: Callable[[list[str]], list[str]]) -> EvalPrompts:
    """This rank's share of E's prompts, ``select(uids)`` of the global batch's distinct ``uids`` (the forecast's
    ``ForecastSettings.eval_uids``: sorted), the same count on every rank.

    Args:
        prompts: uid -> prompt ids of this rank's rows (:func:`prompts_by_uid`, or the engine worker's).

    Raises:
        ValueError: fewer of E's prompts than data-parallel ranks.
    """
    rank, size = world()
    if size > 1:
        gathered: list[dict[str, list[int]]] = [None] * size  # type: ignore[list-item]
        torch.distributed.all_gather_object(gathered, prompts)
        prompts = {uid: ids for part in gathered for uid, ids in part.items()}
    uids = select(list(prompts))
    mine = _rank_share(len(uids))
    return EvalPrompts([prompts[uids[i]] for i in mine], len(uids), len(uids) - len(mine) * size)


def _rank_share(total: int) -> range:
    """This rank's indices into ``total`` sorted prompts: ``rank, rank + W, ...``, the same count on every rank.

    Raises:
        ValueError: fewer prompts than data-parallel ranks.
    """
    rank, size = world()
    share = total // size
    if share == 0:
        raise ValueError(
            f"entropy forecast: E has {total} prompts for {size} data-parallel ranks; each needs one (raise "
            f"{SECTION}.eval_share or the batch's prompts)"
        )
    return range(rank, share * size, size)


def rollout_eval_share(responses: EvalResponses, pad_token_id: int) -> tuple[EvalPrompts, dict[str, torch.Tensor]]:
    """This rank's share of the rollout's E: its prompts and their probe batch (L_max = ``responses.budget``).

    Raises:
        ValueError: fewer prompts than data-parallel ranks, or a response longer than the budget.
    """
    mine = _rank_share(len(responses.uids))
    prompts = [responses.prompt_ids[i].tolist() for i in mine]
    sampled = [[r.tolist() for r in responses.response_ids[i]] for i in mine]
    G = len(sampled[0])
    batch = make_probe_batch(prompts, sampled, torch.zeros(len(mine), G), pad_token_id, [responses.budget] * len(mine))
    left_out = len(responses.uids) - len(mine) * world()[1]
    return EvalPrompts(prompts, len(responses.uids), left_out), batch
