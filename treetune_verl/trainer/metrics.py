# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Per-step rollout-entropy metrics over the model-generated tokens of a batch, and its agreement with the actor.

The last stop on the entropy's path: the manager adds :func:`rollout_entropy_metrics` to verl's generation timing
dict, which the trainer logs as ``timing_s/agent_loop/rollout_entropy/{mean,p50,p90,max}``; the trainer hooks add
:func:`actor_agreement_metrics` (the sampler's entropy against the actor's own entropy of the same tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from treetune_verl.rollout.rollout_config import entropy_config, support_replay

METRIC_PREFIX = "agent_loop/rollout_entropy"
OVER_SAMPLE_PREFIX = "rollout"
AGREEMENT_PREFIX = "rollout_entropy/actor_abs_diff"
ROWS_WITHOUT_ENTROPY_METRIC = f"{METRIC_PREFIX}/rows_without_entropy"


def rollout_entropy_metrics(
    entropy: torch.Tensor, response_mask: torch.Tensor, has_entropy: torch.Tensor | None = None
) -> dict[str, float]:
    """Mean, median, 90th percentile and maximum of the entropy (nats) over model-generated tokens.

    Shape notation: ``B`` = batch, ``R`` = response_length.

    Args:
        entropy: ``[B, R]`` float, ``batch["rollout_entropy"]``.
        response_mask: ``[B, R]`` 0/1, ``batch["response_mask"]``; only tokens with 1 count (all pooled together,
            so a long response weighs more than a short one).
        has_entropy: ``[B]`` bool, ``batch["has_rollout_entropy"]``; rows with ``False`` (a loop that carries no
            entropy) are left out: their zeros are not measured entropies. ``None``: every row counts.

    Returns:
        ``{"agent_loop/rollout_entropy/{mean,p50,p90,max}": float}`` (percentiles linearly interpolated, as
        ``numpy.percentile``; absent when no token counts) and, with ``has_entropy``,
        ``"agent_loop/rollout_entropy/rows_without_entropy"``: how many rows were left out.
    """
    mask = response_mask.bool()
    metrics: dict[str, float] = {}
    if has_entropy is not None:
        mask = mask & has_entropy.bool().unsqueeze(-1)
        metrics[ROWS_WITHOUT_ENTROPY_METRIC] = float((~has_entropy.bool()).sum())
    values = entropy[mask].double().cpu().numpy()
    if values.size == 0:
        return metrics
    p50, p90 = np.percentile(values, [50, 90])
    return metrics | {
        f"{METRIC_PREFIX}/mean": float(values.mean()),
        f"{METRIC_PREFIX}/p50": float(p50),
        f"{METRIC_PREFIX}/p90": float(p90),
        f"{METRIC_PREFIX}/max": float(values.max()),
    }


def actor_agreement_metrics(
    rollout_entropy: torch.Tensor,
    actor_entropy: torch.Tensor,
    response_mask: torch.Tensor,
    has_entropy: torch.Tensor | None = None,
) -> dict[str, float]:
    """Mean and max of ``|rollout_entropy - actor_entropy|`` (nats) over the model-generated tokens.

    The end-to-end alignment check: the sampler's entropy of each token against the entropy that verl's actor
    computes for the same token in its old-log-prob pass. Comparable when both describe the same distribution:
    ``tempered`` mode (or ``raw`` at temperature 1) over the full vocabulary. Shape notation as above.

    Args:
        rollout_entropy: ``[B, R]`` ``batch["rollout_entropy"]``.
        actor_entropy: ``[B, R]`` the actor's per-token entropy (verl's ``entropys``).
        response_mask: ``[B, R]`` 0/1; only tokens with 1 count.
        has_entropy: ``[B]`` bool; rows with ``False`` carry no rollout entropy and are left out.

    Returns:
        ``{"rollout_entropy/actor_abs_diff/{mean,max}": float}``, or ``{}`` when no token counts.
    """
    mask = response_mask.bool()
    if has_entropy is not None:
        mask = mask & has_entropy.bool().unsqueeze(-1)
    diff = (rollout_entropy.double() - actor_entropy.double()).abs()[mask]
    if diff.numel() == 0:
        return {}
    return {f"{AGREEMENT_PREFIX}/mean": float(diff.mean()), f"{AGREEMENT_PREFIX}/max": float(diff.max())}


# Over-sampling's and failed rows' metrics, the same keys on both stacks (issue 49): the rollout's side
# (:func:`abort_metrics`: verl 0.9.1's replay buffer, verl 0.7.1's manager) and the trainer's (:func:`score_metrics`,
# once the rows are scored). A test compares each stack's run against this set.
ABORT_METRICS = tuple(
    f"{OVER_SAMPLE_PREFIX}/{name}"
    for name in (
        "kept_groups",
        "aborted_groups",
        "failed_groups",
        "aborted_rows",
        "failed_rows",
        "aborted_ratio",
        "aborted_tokens",
        "abort_wait_s",
    )
)
ABORTED_ROWS_METRIC = f"{OVER_SAMPLE_PREFIX}/aborted_rows"
COMPLETED_SCORE_METRIC = f"{OVER_SAMPLE_PREFIX}/score/completed_mean"
ABORTED_AS_ZERO_METRIC = f"{OVER_SAMPLE_PREFIX}/score/aborted_as_zero_mean"
OVER_SAMPLE_METRICS = (*ABORT_METRICS, COMPLETED_SCORE_METRIC, ABORTED_AS_ZERO_METRIC)
# Carry-over's, besides ``staleness/<k>`` (kept tokens sampled k updates ago): verl 0.7.1's
# ``agent_loop/carry_over.py`` and verl 0.9.1's replay buffer (with the servers' token ledger) log these keys.
CARRY_OVER_PREFIX = f"{OVER_SAMPLE_PREFIX}/carry_over/"
CARRY_OVER_METRICS = tuple(
    CARRY_OVER_PREFIX + name
    for name in (
        "groups_resumed",
        "groups_carried",
        "rows_trained",
        "tokens_trained",
        "tokens_generated",
        "tokens_carried",
        "tokens_discarded",
        "discarded_share",
        "backlog",
        "prompt_wait_max",
        "prompt_wait_bound",
        "rows_restarted_stale",
        "tokens_discarded_stale",
    )
)


def abort_metrics(
    *,
    kept_groups: int,
    aborted_groups: int,
    failed_groups: int,
    kept_rows: int,
    aborted_rows: int,
    failed_rows: int,
    aborted_tokens: int,
    abort_wait_s: float,
) -> dict[str, float]:
    """A step's aborted share, as both stacks count it.

    Args:
        kept_groups, kept_rows: the whole groups trained and their rows.
        aborted_groups, aborted_rows: the groups dropped (not kept: cut, finished too late, or failed) and all their
            rows, the finished ones and those whose agent loop raised included.
        failed_groups, failed_rows: the dropped groups with a row whose agent loop raised, and those rows.
        aborted_tokens: the response tokens the aborted rows had when they stopped.
        abort_wait_s: the step's wait from the target reached to the aborted rows settled (``timing.py``).
    """
    rows = kept_rows + aborted_rows
    values = {
        "kept_groups": kept_groups,
        "aborted_groups": aborted_groups,
        "failed_groups": failed_groups,
        "aborted_rows": aborted_rows,
        "failed_rows": failed_rows,
        "aborted_ratio": aborted_rows / rows if rows else 0.0,
        "aborted_tokens": aborted_tokens,
        "abort_wait_s": abort_wait_s,
    }
    return {f"{OVER_SAMPLE_PREFIX}/{name}": float(value) for name, value in values.items()}


def score_metrics(completed_mean: float | None, kept_rows: int, aborted_rows: int) -> dict[str, float]:
    """The step's reward seen two ways: ``rollout/score/completed_mean``, the kept rows' mean score (what verl's
    ``critic/score/mean`` reports when aborted rows never reach its batch; biased up, since the aborted rows are the
    long, hard ones; absent when no row was kept), and ``rollout/score/aborted_as_zero_mean``, every row with the
    aborted ones as 0 (biased down)."""
    if not kept_rows or completed_mean is None:
        return {ABORTED_AS_ZERO_METRIC: 0.0}
    return {
        COMPLETED_SCORE_METRIC: float(completed_mean),
        ABORTED_AS_ZERO_METRIC: float(completed_mean) * kept_rows / (kept_rows + aborted_rows),
    }


def batch_abort_metrics(
    uids: Any, aborted: torch.Tensor, failed: torch.Tensor, aborted_tokens: torch.Tensor, abort_wait_s: float
) -> dict[str, float]:
    """:func:`abort_metrics` of a batch that holds its aborted rows (verl 0.7.1's manager).

    Args:
        uids: ``[B]`` each row's group (``non_tensor_batch["uid"]``).
        aborted, failed: ``[B]`` bool, ``batch["rollout_aborted"]`` / ``batch["rollout_failed"]``.
        aborted_tokens: ``[B]`` int, the tokens each aborted row had when it stopped (0 for kept rows).
        abort_wait_s: as in :func:`abort_metrics`.
    """
    groups = [str(uid) for uid in uids]
    aborted_list, failed_list = aborted.bool().tolist(), failed.bool().tolist()
    dropped = {group for group, cut in zip(groups, aborted_list, strict=True) if cut}
    failed_groups = {group for group, bad in zip(groups, failed_list, strict=True) if bad}
    return abort_metrics(
        kept_groups=len(set(groups) - dropped),
        aborted_groups=len(dropped),
        failed_groups=len(failed_groups),
        kept_rows=aborted_list.count(False),
        aborted_rows=aborted_list.count(True),
        failed_rows=failed_list.count(True),
        aborted_tokens=int(aborted_tokens.sum()),
        abort_wait_s=abort_wait_s,
    )


MANAGED_PREFIX = "managed"


def managed_session_metrics(rows: list[dict | None]) -> dict[str, float]:
    """A step's managed sessions: their rows and branches, the agents' own rewards, turns and tool calls.

    Args:
        rows: one entry per batch row, ``non_tensor_batch["treetune_managed_row"]``: ``{"rows", "branches", "turns",
            "tool_calls", "agent_score"}`` for a managed session's row (``rows`` and ``branches`` its session's),
            ``None`` for any other row.

    Returns:
        ``{}`` without managed rows; else ``managed/rows_per_session/mean`` and ``managed/branches_per_session/mean``
        (per session: a session of k rows counts once), ``managed/turns_per_row/mean``,
        ``managed/tool_calls_per_row/mean``, ``managed/agent_scored_ratio`` (rows the agent scored) and, when it
        scored any, ``managed/agent_reward/mean`` over those rows.
    """
    managed = [row for row in rows if row is not None]
    if not managed:
        return {}
    sessions = sum(1.0 / row["rows"] for row in managed)
    scores = [row["agent_score"] for row in managed if row["agent_score"] is not None]
    metrics = {
        f"{MANAGED_PREFIX}/rows_per_session/mean": len(managed) / sessions,
        f"{MANAGED_PREFIX}/branches_per_session/mean": sum(row["branches"] / row["rows"] for row in managed) / sessions,
        f"{MANAGED_PREFIX}/turns_per_row/mean": float(np.mean([row["turns"] for row in managed])),
        f"{MANAGED_PREFIX}/tool_calls_per_row/mean": float(np.mean([row["tool_calls"] for row in managed])),
        f"{MANAGED_PREFIX}/agent_scored_ratio": len(scores) / len(managed),
    }
    if scores:
        metrics[f"{MANAGED_PREFIX}/agent_reward/mean"] = float(np.mean(scores))
    return metrics


def agreement_is_defined(rollout_config: Any) -> bool:
    """Whether rollout entropy and the actor's entropy describe the same distribution.

    verl's actor computes the entropy of softmax(logits / T) over the full vocabulary at the rollout temperature T
    (``dp_actor.py`` ``_forward_micro_batch``): ``tempered`` mode, or ``raw`` mode at T = 1, without top-k; in
    ``support`` mode its logits are masked outside each token's sampled support (``verl/v0_9_1/support_replay.py``),
    so both are the entropy over that support.
    """
    config = entropy_config(rollout_config)
    if config.mode == "support":  # the actor's entropy is over the support only where it replays it
        return support_replay(rollout_config)
    temperature = float(rollout_config.get("temperature", 1.0))
    return config.top_k is None and (config.mode == "tempered" or temperature == 1.0)


SUPPORT_PREFIX = "rollout_support"
# TRL #6789's band: the share of tokens whose importance ratio lies outside it
RATIO_BAND = (0.9, 1.1)


def support_metrics(
    supports: list[list[Any] | None],
    response_masks: list[torch.Tensor],
    old_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
) -> dict[str, float]:
    """The sampled support's metrics (entropy mode ``support``, issue 48) over the model-generated tokens of the rows.

    Args:
        supports: per row, its ``extra_fields["response_support"]`` (one ``(size, kept_mass, sampled_logprob,
            token_ids)`` per response token), or ``None`` (replay off, or a row that carries none).
        response_masks, old_log_probs, rollout_log_probs: per row ``[R_i]`` (verl 0.9.1: the row's own length;
            verl 0.7.1: the batch's padded response length, longer than the row's supports): 1 at model tokens; the
            actor's log-probs of the batch's tokens before the update; the behaviour log-probs the rollout served
            (with mode ``support``: renormalised over the support each token was sampled from).

    Raises:
        ValueError: a row whose mask marks a model token past its last support (the rows and the batch disagree).

    Returns:
        ``rollout_support/importance_ratio_{mean,outside_0.9_1.1}``: ``exp(old - rollout)`` over every model token
        (1 where the actor scores the distribution the token was drawn from; the kept mass where it scores the
        whole vocabulary against a truncated draw), and, over the tokens with a support: ``size_{mean,p99}`` and
        ``kept_mass_mean`` of the truncated ones, ``untruncated_share``.
    """
    metrics: dict[str, float] = {}
    ratios = [
        torch.exp(old.double() - rollout.double())[mask.bool()]
        for mask, old, rollout in zip(response_masks, old_log_probs, rollout_log_probs, strict=True)
    ]
    ratios = torch.cat(ratios) if ratios else torch.zeros(0)
    if ratios.numel():
        low, high = RATIO_BAND
        metrics[f"{SUPPORT_PREFIX}/importance_ratio_mean"] = float(ratios.mean())
        metrics[f"{SUPPORT_PREFIX}/importance_ratio_outside_{low}_{high}"] = float(
            ((ratios < low) | (ratios > high)).double().mean()
        )
    sizes, masses, untruncated, counted = [], [], 0, 0
    for i, (row, mask) in enumerate(zip(supports, response_masks, strict=True)):
        if row is None:
            continue
        mask = mask.tolist()
        if len(row) > len(mask) or any(mask[len(row) :]):
            raise ValueError(f"row {i}: {len(row)} supports for a response mask of {len(mask)} ({sum(mask)} set)")
        for support, model_token in zip(row, mask[: len(row)], strict=True):
            if not model_token:
                continue
            counted += 1
            if support[3] is None:
                untruncated += 1
            else:
                sizes.append(float(support[0]))
                masses.append(float(support[1]))
    if counted:
        metrics[f"{SUPPORT_PREFIX}/untruncated_share"] = untruncated / counted
    if sizes:
        metrics[f"{SUPPORT_PREFIX}/size_mean"] = float(np.mean(sizes))
        metrics[f"{SUPPORT_PREFIX}/size_p99"] = float(np.percentile(sizes, 99))
        metrics[f"{SUPPORT_PREFIX}/kept_mass_mean"] = float(np.mean(masses))
    return metrics
