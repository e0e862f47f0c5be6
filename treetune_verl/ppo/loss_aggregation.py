# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The legacy FSDP actor's loss over the completed rows of each mini-batch, when a batch has aborted rows.

An aborted row reaches the actor with an all-zero ``response_mask`` (and ``batch["rollout_aborted"]`` True). verl
0.7.1's legacy actor (``verl/workers/actor/dp_actor.py`` ``DataParallelPPOActor.update_policy``, the default with
``trainer.use_legacy_worker_impl=auto``) aggregates each micro-batch on its own
(``verl/trainer/ppo/core_algos.py`` ``agg_loss`` with ``config.global_batch_info == {}``) and scales it by
``loss_scale_factor`` (``1 / gradient_accumulation``, or ``rows / ppo_mini_batch_size`` with ``use_dynamic_bsz``):

- a micro-batch whose rows are all aborted divides 0 by 0 in every ``loss_agg_mode``: its loss and the
  ``actor/pg_loss`` metric (entropy, KL too) are NaN. Its gradient is 0, not NaN (``verl/utils/torch_functional.py``
  ``masked_sum`` selects with ``torch.where``, which drops the NaN on the way back), so the step is taken, but the
  empty micro-batch keeps its 1/G share: with 1 of 2 micro-batches empty the gradient is half the completed rows';
- a micro-batch with fewer completed rows still gets a full 1/G share, so its rows weigh more than others.

With the patch, each mini-batch's loss is its completed rows' loss normalised over the whole mini-batch, across
data-parallel ranks (C: completed rows of the global mini-batch, T: their tokens, ``m``: ``response_mask``):

- ``token-mean``: sum(loss * m) / T
- ``seq-mean-token-sum``: sum over completed rows of sum_t(loss * m), / C
- ``seq-mean-token-mean``: sum over completed rows of (sum_t(loss * m) / n_r), / C
- ``seq-mean-token-sum-norm``: ``seq-mean-token-sum`` / horizon (verl's ``loss_scale_factor`` argument, else the
  response length)

An all-aborted micro-batch contributes exactly 0 (with zero gradients); a mini-batch without a completed row has
loss 0 and zero gradients, and the optimizer step still happens (as verl's does; with weight decay or momentum the
parameters can still move). Each rank's ``actor/pg_loss`` is then its share of the global loss times the
data-parallel size, so its mean over ranks is the global mini-batch loss (summed over mini-batches, as verl sums it).

Mechanism (the seams are ``treetune_verl/verl/v0_7_1/actor_seams.py``'s): around ``DataParallelPPOActor.update_policy``,
:func:`normalisation_for` counts C and T per mini-batch exactly as verl splits (``data.split(ppo_mini_batch_size)``,
repeated for each of ``ppo_epochs``) and the aborted rows, summed over the data-parallel ranks (one small all-reduce:
a rank without aborted rows of its own must still take part). If some row is aborted, verl's ``update_policy`` runs
with that :class:`MiniBatchNormalisation` active: it moves to the next mini-batch at each ``_optimizer_step`` (dp_actor
calls it once at the end of a mini-batch), and verl's ``agg_loss`` (``core_algos.agg_loss``, looked up as a module
global by the policy losses, and ``dp_actor.agg_loss``, imported by name for the entropy and KL terms) goes through
:func:`aggregate`: verl's own ``agg_loss`` with the mini-batch's global C and T and the data-parallel size, divided by
the micro-batch's ``loss_scale_factor`` that dp_actor is about to multiply by. Outside it, verl's ``agg_loss``
unchanged, except that a zero denominator gives 0 instead of NaN.

Not handled: the new worker implementation (``trainer.use_legacy_worker_impl=disable``: ``verl/workers/utils/
losses.py`` ``ppo_loss`` already normalises ``token-mean`` by the global token count, but divides the seq-mean
modes by ``ppo_mini_batch_size``, ``ray_trainer.py`` ``_update_actor``), Megatron's actor, and Ulysses sequence
parallelism (refused: the counts would be summed over sequence-parallel ranks too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from treetune_verl.batch_keys import ROLLOUT_ABORTED_KEY

__all__ = ["MiniBatchNormalisation", "aggregate", "mini_batch_counts", "normalisation_for"]


def mini_batch_counts(response_mask: torch.Tensor, mini_batch_size: int) -> torch.Tensor:
    """Completed rows and their tokens in each mini-batch of ``data.split(mini_batch_size)``.

    Args:
        response_mask: [batch, response_length].
        mini_batch_size: verl's (per-rank) ``ppo_mini_batch_size``.

    Returns:
        [num_mini_batches, 2] int64: (completed rows, completed tokens).
    """
    tokens = response_mask.sum(dim=-1).to(torch.int64)
    return torch.stack([torch.stack([(t > 0).sum(), t.sum()]) for t in tokens.split(mini_batch_size)])


def _all_reduce_counts(counts: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``counts`` (int64) summed over the default process group (verl's FSDP workers shard over all ranks), and
    the group's size (1 without torch.distributed)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return counts, 1
    if "gloo" in str(torch.distributed.get_backend()):  # verl's workers: "cpu:gloo,cuda:nccl"
        reduced = counts.clone()
    else:
        from verl.utils.device import get_device_id, get_device_name

        reduced = counts.to(torch.device(get_device_name(), get_device_id()))
    torch.distributed.all_reduce(reduced)
    return reduced.cpu(), torch.distributed.get_world_size()


@dataclass
class MiniBatchNormalisation:
    """What ``agg_loss`` needs during one ``update_policy`` call: the global counts and where in them it is."""

    actor: Any  # the DataParallelPPOActor: its loss_scale_factor inputs
    counts: list[list[int]]  # [num_mini_batches][completed rows, completed tokens], global
    dp_size: int
    optimizer_steps: int = 0

    def optimizer_step(self, step: Callable[[], Any]) -> Any:
        """verl's ``_optimizer_step`` (``step``), then the next mini-batch's counts."""
        try:
            return step()
        finally:
            self.optimizer_steps += 1

    def aggregate(
        self,
        agg_loss: Callable[..., torch.Tensor],
        loss_mat: torch.Tensor,
        loss_mask: torch.Tensor,
        loss_agg_mode: str,
        horizon: int | None,
    ) -> torch.Tensor:
        rows, tokens = self.counts[self.optimizer_steps % len(self.counts)]  # mini-batches repeat per ppo_epoch
        if (tokens if loss_agg_mode == "token-mean" else rows) == 0:
            return _zero_loss(loss_mat, loss_mask)
        config = self.actor.config
        if config.use_dynamic_bsz:  # dp_actor.py update_policy: the loss_scale_factor it multiplies this loss by
            micro_scale = loss_mask.shape[0] / config.ppo_mini_batch_size
        else:
            micro_scale = 1 / self.actor.gradient_accumulation
        # verl's own global normalisation (its global_batch_info path); times dp_size because FSDP averages the
        # gradients over the ranks.
        loss = agg_loss(loss_mat, loss_mask, loss_agg_mode, self.dp_size, tokens, rows, horizon)
        return loss / micro_scale


def normalisation_for(actor: Any, data: Any) -> MiniBatchNormalisation | None:
    """The normalisation ``actor.update_policy(data)`` needs: ``None`` when no row of the global batch is aborted
    (or the batch has no ``rollout_aborted``), verl's loss unchanged then.

    Every rank holds the key (its chunk of the same batch), but maybe no aborted row of its own: the decision must be
    the same on all ranks, so it is taken after the all-reduce.

    Raises:
        NotImplementedError: aborted rows with Ulysses sequence parallelism (the counts would be summed over
            sequence-parallel ranks too).
    """
    aborted = data.batch.get(ROLLOUT_ABORTED_KEY, None) if data.batch is not None else None
    if aborted is None:
        return None
    counts = mini_batch_counts(data.batch["response_mask"], actor.config.ppo_mini_batch_size)
    summed, dp_size = _all_reduce_counts(torch.cat([counts.flatten(), aborted.sum().view(1).to(torch.int64)]))
    if summed[-1] == 0:
        return None
    if actor.ulysses_sequence_parallel_size > 1:
        raise NotImplementedError(
            "treetune_verl.ppo.loss_aggregation: batches with aborted rollouts are not supported with "
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={actor.ulysses_sequence_parallel_size}; "
            "set it to 1."
        )
    return MiniBatchNormalisation(actor, summed[:-1].view(-1, 2).tolist(), dp_size)


def _zero_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """An exact 0 that keeps the graph (zero gradients; masked_sum ignores non-finite values off the mask)."""
    import verl.utils.torch_functional as verl_F

    return verl_F.masked_sum(loss_mat, loss_mask) * 0.0


def aggregate(
    agg_loss: Callable[..., torch.Tensor],
    active: MiniBatchNormalisation | None,
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_args: tuple[int, int | None, int | None, int | None],
) -> torch.Tensor:
    """verl's ``agg_loss`` (passed in) over the completed rows when ``active`` (inside ``update_policy`` of a batch
    with aborted rows); otherwise verl's, with 0 instead of NaN for a zero denominator.

    ``global_args``: verl's ``(dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)`` as the caller gave
    them.
    """
    dp_size, batch_num_tokens, global_batch_size, loss_scale_factor = global_args
    global_info = dp_size != 1 or batch_num_tokens is not None or global_batch_size is not None
    if active is not None and not global_info:
        return active.aggregate(agg_loss, loss_mat, loss_mask, loss_agg_mode, loss_scale_factor)
    if active is not None:
        raise RuntimeError(
            "treetune_verl.ppo.loss_aggregation: agg_loss got global batch info inside the legacy actor's "
            "update_policy; this verl does not match the one the patch was written for."
        )
    denominator = batch_num_tokens if loss_agg_mode == "token-mean" else global_batch_size
    if (denominator == 0) if denominator is not None else not bool(loss_mask.any()):
        return _zero_loss(loss_mat, loss_mask)
    return agg_loss(loss_mat, loss_mask, loss_agg_mode, *global_args)
