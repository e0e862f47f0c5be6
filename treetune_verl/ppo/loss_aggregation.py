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

Mechanism, three one-attribute patches (idempotent, guarded by verl's version and the exact signatures):

- ``DataParallelPPOActor.update_policy``: when the batch has ``rollout_aborted`` (every rank's chunk has it or
  none has), counts C and T per mini-batch exactly as verl splits (``data.split(ppo_mini_batch_size)``, repeated for
  each of ``ppo_epochs``) and the aborted rows, and sums them over the data-parallel ranks (one small all-reduce: a
  rank without aborted rows of its own must still take part). If some row is aborted, it runs verl's
  ``update_policy`` inside a normalisation context that moves to the next mini-batch at each ``_optimizer_step``
  (dp_actor calls it once at the end of a mini-batch); otherwise verl's ``update_policy`` untouched.
- ``core_algos.agg_loss`` (looked up as a module global by the policy losses) and ``dp_actor.agg_loss`` (imported
  by name for the entropy and KL terms): inside the context, verl's own ``agg_loss`` with the mini-batch's global
  C and T and the data-parallel size, divided by the micro-batch's ``loss_scale_factor`` that dp_actor is about to
  multiply by. Outside it, verl's ``agg_loss`` unchanged, except that a zero denominator gives 0 instead of NaN.

Not handled: the new worker implementation (``trainer.use_legacy_worker_impl=disable``: ``verl/workers/utils/
losses.py`` ``ppo_loss`` already normalises ``token-mean`` by the global token count, but divides the seq-mean
modes by ``ppo_mini_batch_size``, ``ray_trainer.py`` ``_update_actor``), Megatron's actor, and Ulysses sequence
parallelism (refused: the counts would be summed over sequence-parallel ranks too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from treetune_verl.patching import original_of, replace_attr
from treetune_verl.verl_guard import check_signature, require_verl, undecorated

__all__ = ["ABORTED_KEY", "install", "mini_batch_counts"]

ABORTED_KEY = "rollout_aborted"  # batch key: bool [batch], True for a row whose rollout was aborted

# Signatures the wrappers repeat: verl 0.7.1 trainer/ppo/core_algos.py, workers/actor/dp_actor.py.
AGG_LOSS_PARAMS = (
    "loss_mat",
    "loss_mask",
    "loss_agg_mode",
    "dp_size",
    "batch_num_tokens",
    "global_batch_size",
    "loss_scale_factor",
)
UPDATE_POLICY_PARAMS = ("self", "data")
OPTIMIZER_STEP_PARAMS = ("self",)


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
class _MiniBatchNormalisation:
    """What ``agg_loss`` needs during one ``update_policy`` call: the global counts and where in them it is."""

    actor: Any  # the DataParallelPPOActor: its loss_scale_factor inputs
    counts: list[list[int]]  # [num_mini_batches][completed rows, completed tokens], global
    dp_size: int
    optimizer_steps: int = 0

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


_ACTIVE: _MiniBatchNormalisation | None = None


@contextlib.contextmanager
def _normalising(normalisation: _MiniBatchNormalisation) -> Iterator[None]:
    """Activate ``normalisation`` for ``agg_loss``, and advance it at each of the actor's optimizer steps.

    ``_optimizer_step`` is wrapped as an instance attribute for the duration only (restored also on exceptions).
    """
    global _ACTIVE
    actor = normalisation.actor
    own = vars(actor)
    had_own_step = "_optimizer_step" in own
    previous_own_step = own.get("_optimizer_step")
    step = actor._optimizer_step

    def _optimizer_step():
        try:
            return step()
        finally:
            normalisation.optimizer_steps += 1

    previous_active, _ACTIVE = _ACTIVE, normalisation
    actor._optimizer_step = _optimizer_step
    try:
        yield
    finally:
        _ACTIVE = previous_active
        if had_own_step:
            actor._optimizer_step = previous_own_step
        else:
            del actor._optimizer_step


def _zero_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """An exact 0 that keeps the graph (zero gradients; masked_sum ignores non-finite values off the mask)."""
    import verl.utils.torch_functional as verl_F

    return verl_F.masked_sum(loss_mat, loss_mask) * 0.0


def _wrap_agg_loss(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def agg_loss(
        loss_mat: torch.Tensor,
        loss_mask: torch.Tensor,
        loss_agg_mode: str,
        dp_size: int = 1,
        batch_num_tokens: int | None = None,
        global_batch_size: int | None = None,
        loss_scale_factor: int | None = None,
    ) -> torch.Tensor:
        global_info = dp_size != 1 or batch_num_tokens is not None or global_batch_size is not None
        if _ACTIVE is not None and not global_info:
            return _ACTIVE.aggregate(original, loss_mat, loss_mask, loss_agg_mode, loss_scale_factor)
        if _ACTIVE is not None:
            raise RuntimeError(
                "treetune_verl.ppo.loss_aggregation: agg_loss got global batch info inside the legacy actor's "
                "update_policy; this verl does not match the one the patch was written for."
            )
        denominator = batch_num_tokens if loss_agg_mode == "token-mean" else global_batch_size
        if (denominator == 0) if denominator is not None else not bool(loss_mask.any()):
            return _zero_loss(loss_mat, loss_mask)
        return original(
            loss_mat, loss_mask, loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor
        )

    return agg_loss


def _wrap_update_policy(original: Callable[..., Any]) -> Callable[..., Any]:
    def update_policy(self, data):
        aborted = data.batch.get(ABORTED_KEY, None) if data.batch is not None else None
        if aborted is None:
            return original(self, data)
        # Every rank holds the key (its chunk of the same batch), but maybe no aborted row of its own: the decision
        # to normalise must be the same on all ranks, so it is taken after the all-reduce.
        counts = mini_batch_counts(data.batch["response_mask"], self.config.ppo_mini_batch_size)
        summed, dp_size = _all_reduce_counts(torch.cat([counts.flatten(), aborted.sum().view(1).to(torch.int64)]))
        if summed[-1] == 0:
            return original(self, data)
        if self.ulysses_sequence_parallel_size > 1:
            raise NotImplementedError(
                "treetune_verl.ppo.loss_aggregation: batches with aborted rollouts are not supported with "
                f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={self.ulysses_sequence_parallel_size}; "
                "set it to 1."
            )
        with _normalising(_MiniBatchNormalisation(self, summed[:-1].view(-1, 2).tolist(), dp_size)):
            return original(self, data)

    return update_policy


def install() -> None:
    """Install the three patches in this process (idempotent); a worker does it by importing ``actor_setup``.

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped function.
    """
    from verl.trainer.ppo import core_algos
    from verl.workers.actor import dp_actor

    require_verl("loss aggregation for aborted rollouts")
    actor = dp_actor.DataParallelPPOActor
    check_signature(core_algos.agg_loss, AGG_LOSS_PARAMS, "core_algos.agg_loss")
    check_signature(dp_actor.agg_loss, AGG_LOSS_PARAMS, "dp_actor.agg_loss")
    check_signature(
        undecorated(original_of(actor.update_policy)), UPDATE_POLICY_PARAMS, "DataParallelPPOActor.update_policy"
    )
    check_signature(actor._optimizer_step, OPTIMIZER_STEP_PARAMS, "DataParallelPPOActor._optimizer_step")
    replace_attr(core_algos, "agg_loss", _wrap_agg_loss)
    replace_attr(dp_actor, "agg_loss", _wrap_agg_loss)
    replace_attr(actor, "update_policy", _wrap_update_policy)
