# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""GRPO and RLOO over each group's completed rows, and which of verl's estimators train right with aborted groups.

Over-sampling aborts whole groups (``agent_loop/over_sample.py``), so verl's own ``grpo`` / ``rloo`` are exact with
it (:data:`ESTIMATORS_WITH_ABORTED_GROUPS` lists every estimator). ``grpo_valid`` / ``rloo_valid`` stay for rows
that end empty within a kept group (a trajectory that produced no token) and for batches built elsewhere. In verl
0.9.1's V1 trainer the aborted groups never reach the trainer, but verl pads the smaller batch with synthetic rows:
:data:`ESTIMATORS_WITH_PADDING_ROWS` and :data:`LOSS_AGG_MODES_WITH_PADDING_ROWS` say which estimators and which
``loss_agg_mode`` values train the kept rows as if the padding rows were not there.

An empty (aborted) row reaches the trainer with an all-zero ``response_mask`` and score 0. verl's ``grpo`` / ``rloo``
(``verl/trainer/ppo/core_algos.py`` ``compute_grpo_outcome_advantage`` / ``compute_rloo_outcome_advantage``) count
it in its group's mean and std: one aborted row in a group of 4 scored [1, 1, 0] moves the advantages from
[0.577, 0.577, -1.155] (the 3 completed rows alone) to [0.866, 0.866, -0.866]. The estimators registered here,
``algorithm.adv_estimator=grpo_valid`` / ``rloo_valid``, call verl's own function on the completed rows only and
scatter the result back:

- a row is *completed* iff its ``response_mask`` has a 1 (the estimator sees no other flag; an aborted row has none);
- an aborted row gets advantage (and return) 0;
- a group with an aborted row and fewer than 2 completed rows gets 0 for all its rows: one completed row has no
  baseline (verl would hand it its raw score, as it does for a group of size 1);
- a group without an aborted row is exactly what verl computes (bit for bit, size-1 groups at ``rollout.n == 1``
  included), so a batch without aborted rows gives verl's result.

The trainer calls these as ``fn(token_level_rewards=, response_mask=, config=algorithm_config, index=uid)``
(``verl/trainer/ppo/ray_trainer.py`` ``compute_advantage``, the branch for estimators other than GAE and GRPO), in
the trainer's process: that process must import this module (registration happens at import).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

__all__ = [
    "ESTIMATORS_WITH_ABORTED_GROUPS",
    "ESTIMATORS_WITH_PADDING_ROWS",
    "GRPO_VALID",
    "LOSS_AGG_MODES_WITH_PADDING_ROWS",
    "RLOO_VALID",
    "completed_rows",
    "exact_entries",
    "compute_grpo_valid_advantage",
    "compute_rloo_valid_advantage",
    "supported_with_aborted_groups",
    "supported_with_padding_rows",
]

GRPO_VALID = "grpo_valid"
RLOO_VALID = "rloo_valid"

_VERL_CANNOT_CALL = (
    "verl 0.7.1's compute_advantage cannot call it (it passes config=, which the function does not take)"
)
# verl 0.7.1's registered estimators with over-sampling, which aborts whole groups (``agent_loop/over_sample.py``):
# ``None`` when the kept rows' advantages are exactly what verl computes without the aborted rows and the aborted rows
# get none (measured through verl's own ``ray_trainer.compute_advantage``:
# ``treetune_tests/treetune_verl/ppo/test_estimators_with_aborted_groups_on_cpu.py``), else why it is refused.
ESTIMATORS_WITH_ABORTED_GROUPS: dict[str, str | None] = {
    "grpo": None,
    "grpo_vectorized": None,
    "grpo_passk": None,
    "gdpo": None,  # per-dimension group statistics, then a whitening over response_mask (aborted rows are 0 there)
    "rloo": None,
    "rloo_vectorized": None,
    "reinforce_plus_plus": None,  # whitening over response_mask
    "reinforce_plus_plus_baseline": None,
    GRPO_VALID: None,
    RLOO_VALID: None,
    "gae": "a critic would fit values to the aborted rows, and its value loss does not leave them out",
    "gpg": "its batch-wide scale (rows / rows with a non-zero score) counts the aborted rows",
    "opo": "an aborted group's length-weighted baseline is 0 / 0: NaN advantages on its rows",
    "remax": "its greedy baseline rollout goes through the same over-sampled generation, which aborts baseline rows",
    "optimal_token_baseline": _VERL_CANNOT_CALL,
    "tir_optimal_token_baseline": _VERL_CANNOT_CALL,
}


def exact_entries(table: dict[str, str | None]) -> list[str]:
    """The names a table above marks exact (reason ``None``), sorted."""
    return sorted(name for name, reason in table.items() if reason is None)


def supported_with_aborted_groups() -> list[str]:
    """The estimators that train right with over-sampling's aborted groups, sorted."""
    return exact_entries(ESTIMATORS_WITH_ABORTED_GROUPS)


_V1_NO_SUM_PI_SQUARED = "verl 0.9.1's V1 _compute_advantage fetches no sum_pi_squared: AssertionError, padded or not"
_SEQ_MEAN_SCALED = (
    "divides by global_batch_size = ppo_mini_batch_size * rollout.n rows, padding rows counted: the kept rows' loss "
    "is scaled by kept / padded rows of the mini-batch"
)
# verl 0.9.1's registered estimators (plus ``gae``, which its ``compute_advantage`` dispatches itself) in the V1
# trainer, where over-sampling's aborted groups never reach the trainer but the smaller batch is padded by verl's
# ``_balance_batch`` with its synthetic rows (``verl/trainer/ppo/padding_utils.py``: one shared ``pad<hex>`` uid, a
# 1-token response with ``response_mask`` 0 and score 0): ``None`` when the kept rows' advantages and returns are
# exactly those verl computes for the kept rows alone and the padding rows' stay finite (measured through verl's own
# ``upsample_batch_to_divisible_size`` and ``compute_advantage_for_multi_trajectories`` as ``PPOTrainer.
# _compute_advantage`` calls it: ``treetune_tests/treetune_verl/ppo/test_padding_rows_v0_9_1_on_cpu.py``), else why
# it is refused. A plain dict: this module is imported on verl 0.7.1 too.
ESTIMATORS_WITH_PADDING_ROWS: dict[str, str | None] = {
    "grpo": None,  # V1's own per-session path; the padding group scores 0 with std 0: advantage 0
    "grpo_vectorized": None,
    # verl pads by a multiple of rollout.n rows while the actor trains (lcm(dp, ppo_mini_batch_size * n)): the padding
    # group has >= 2 rows, as pass@k needs (a lone padding row would raise)
    "grpo_passk": None,
    "rloo": None,
    "rloo_vectorized": None,
    "reinforce_plus_plus": None,  # whitening over response_mask (0 on padding rows)
    "reinforce_plus_plus_baseline": None,
    "gae": None,  # whitening over response_mask; the critic's value loss follows LOSS_AGG_MODES_WITH_PADDING_ROWS
    GRPO_VALID: None,  # a padding row has no response token: its group gets advantage 0
    RLOO_VALID: None,
    "gpg": "its batch-wide scale (rows / rows with a non-zero score) counts verl's padding rows",
    "opo": (
        "the padding group's length-weighted baseline is 0 / 0: NaN advantages on the padding rows, which give the "
        "actor a NaN gradient through its masked loss (NaN * 0)"
    ),
    "gdpo": "verl 0.9.1's V1 _compute_advantage fetches neither prompts nor the reward keys: KeyError, padded or not",
    "remax": "verl 0.9.1's V1 _compute_advantage passes no reward_baselines: TypeError, padded or not",
    "optimal_token_baseline": _V1_NO_SUM_PI_SQUARED,
    "tir_optimal_token_baseline": _V1_NO_SUM_PI_SQUARED,
}
# verl 0.9.1's ``core_algos.agg_loss`` modes on a mini-batch that holds verl's padding rows, with the arguments the
# V1 trainer's workers pass (``global_batch_size`` = ``ppo_mini_batch_size * rollout.n``, in rows, the mini-batch as
# padded; ``batch_num_tokens`` = the mini-batch's ``loss_mask`` tokens, none on a padding row): ``None`` when the loss
# equals the loss of the kept rows alone as an unpadded mini-batch, else why it is refused (same test as above).
LOSS_AGG_MODES_WITH_PADDING_ROWS: dict[str, str | None] = {
    "token-mean": None,  # divides by batch_num_tokens, which has no padding token
    "token-sum": None,
    "seq-mean-token-sum": _SEQ_MEAN_SCALED,
    "seq-mean-token-sum-norm": _SEQ_MEAN_SCALED,
    "seq-mean-token-mean": _SEQ_MEAN_SCALED,
}


def supported_with_padding_rows() -> list[str]:
    """The estimators that train right in verl 0.9.1's V1 trainer with its padding rows in the batch, sorted."""
    return exact_entries(ESTIMATORS_WITH_PADDING_ROWS)


def completed_rows(response_mask: torch.Tensor) -> torch.Tensor:
    """``[batch]`` bool: rows with at least one response token in the loss (``response_mask``: [batch, response_length])."""
    return response_mask.sum(dim=-1) > 0


def _over_completed_rows(
    upstream: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    **upstream_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``upstream`` estimator on the completed rows, scattered back; see the module docstring for the rules."""
    completed = completed_rows(response_mask)
    keep = completed.cpu().numpy()
    index = np.asarray(index)
    dtype = torch.result_type(token_level_rewards, response_mask)  # what upstream's `scores * response_mask` gives
    advantages = torch.zeros(token_level_rewards.shape, dtype=dtype, device=token_level_rewards.device)
    if keep.any():
        kept, _ = upstream(
            token_level_rewards=token_level_rewards[completed],
            response_mask=response_mask[completed],
            index=index[keep],
            **upstream_kwargs,
        )
        advantages[completed] = kept
    if not keep.all():
        n_completed = Counter(index[keep].tolist())
        with_aborted = set(index[~keep].tolist())
        short = [row for row, uid in enumerate(index.tolist()) if uid in with_aborted and n_completed[uid] < 2]
        advantages[short] = 0.0
    return advantages, advantages


def compute_grpo_valid_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO over each group's completed rows (``algorithm.adv_estimator=grpo_valid``).

    Args:
        token_level_rewards: [batch, response_length]; a row's score is its sum.
        response_mask: [batch, response_length]; an all-zero row is aborted.
        index: [batch] group ids (the ``uid`` column).
        epsilon: added to the group std.
        norm_adv_by_std_in_grpo: divide by the group std; ``None`` reads ``config["norm_adv_by_std_in_grpo"]``
            (default True), which is how verl's trainer passes it to a registered estimator.
        config: verl's ``algorithm`` config (``AlgoConfig`` / dict / ``DictConfig``) or ``None``.

    Returns:
        ``(advantages, returns)``, both [batch, response_length] (the same tensor, as verl's GRPO returns).
    """
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    return _over_completed_rows(
        core_algos.compute_grpo_outcome_advantage,
        token_level_rewards,
        response_mask,
        index,
        epsilon=epsilon,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        config=config,
    )


def compute_rloo_valid_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO over each group's completed rows (``algorithm.adv_estimator=rloo_valid``): score minus the mean of the
    group's other completed rows.

    Args:
        token_level_rewards: [batch, response_length]; a row's score is its sum.
        response_mask: [batch, response_length]; an all-zero row is aborted.
        index: [batch] group ids (the ``uid`` column).
        epsilon: passed to verl's RLOO (which does not use it).
        config: verl's ``algorithm`` config or ``None``.

    Returns:
        ``(advantages, returns)``, both [batch, response_length].
    """
    return _over_completed_rows(
        core_algos.compute_rloo_outcome_advantage,
        token_level_rewards,
        response_mask,
        index,
        epsilon=epsilon,
        config=config,
    )


def _register(name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` under ``name`` with verl; a re-import of this module replaces its own earlier entry.

    verl's ``register_adv_est`` raises when another function object holds the name, which a module reload is.
    """
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    held = registry.get(name)
    if held is not None and (held.__module__, held.__qualname__) == (fn.__module__, fn.__qualname__):
        del registry[name]
    core_algos.register_adv_est(name)(fn)


_register(GRPO_VALID, compute_grpo_valid_advantage)
_register(RLOO_VALID, compute_rloo_valid_advantage)
