# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""E from the rollout: the forecast's fresh responses sampled by the rollout's sglang servers, beside the step's batch.

Shape notation: B = the step's distinct prompts (uids), G = responses per prompt (``rollout.n``), R = the response
budget (``rollout.response_length``).

On a training step the forecast runs (every ``every``-th ``generate_sequences`` call of the manager that trains, the
1st, (1 + k)-th, ...), the manager (``agent_loop/entropy_manager.py``) marks the first row of each of E's uids
(``ForecastSettings.eval_uids``) with an :class:`EvalPlan`; the agent-loop worker that runs the row
(``agent_loop/forecast_eval_worker.py``), when the row's agent loop sends its first turn, sends G requests of E's own
for that prompt, at the rollout's temperature over the whole vocabulary (top-p 1, top-k off: the policy verl's actor
computes its log-probabilities with, which the forecast differentiates), up to R new tokens, in the same server
batches as the step's rows. E is not rows of the batch: it goes to the actor in ``meta_info[FORECAST_EVAL_META_KEY]`` (:class:`EvalResponses`; ``None`` on a
step without a forecast), so no loss, advantage, reward or metric of verl's sees it. E is independent of the batch's
responses U: separate requests, separate samples from the same weights θ.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from verl import DataProto

from treetune_verl.batch_keys import FORECAST_EVAL_KEY, FORECAST_EVAL_PLAN_KEY
from treetune_verl.forecast.settings import ForecastSettings

REQUEST_PREFIX = "forecast-eval-"  # E's requests' sticky keys
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalPlan:
    """What the worker samples for a marked row: ``n`` responses at ``temperature``, up to ``budget`` tokens."""

    n: int
    temperature: float
    budget: int

    def sampling_params(self) -> dict[str, Any]:
        """One E request's sampling parameters (verl's server keys; ``logprobs`` off: E's values come from the
        actor). A fresh dict per request: verl's server pops keys from it."""
        return {
            "temperature": self.temperature,
            "top_p": 1.0,
            "top_k": -1,
            "repetition_penalty": 1.0,
            "max_new_tokens": self.budget,
            "logprobs": False,
        }


@dataclass(frozen=True)
class SampledEval:
    """One prompt's E as a worker returns it: its prompt ids, ``[G]`` responses (int32), the requests' sticky keys
    and the seconds from the first request to the last response."""

    prompt_ids: np.ndarray
    response_ids: list[np.ndarray]
    request_ids: list[str]
    seconds: float


@dataclass(frozen=True)
class EvalResponses:
    """E as the rollout hands it to the actor.

    Attributes:
        uids: ``[B]`` the step's distinct prompt-group ids (verl's ``uid``), sorted.
        prompt_ids: ``[B]`` each prompt's token ids (int32, no padding), from its uid's first row.
        response_ids: ``[B][G]`` each response's token ids (int32, non-empty), ending at an end-of-sequence id or
            at ``budget`` tokens.
        budget: R, E's L_max (the forecast's unit is nats per budget token).
        request_ids: ``[B][G]`` the sticky keys of the requests that sampled them (one request per response, none of
            them a turn of the batch's rows).
    """

    uids: list[str]
    prompt_ids: list[np.ndarray]
    response_ids: list[list[np.ndarray]]
    budget: int
    request_ids: list[list[str]]


class RolloutEval:
    """The manager's side of E: which training calls get one, the plan on the rows, E collected from the output.

    Args:
        settings: the forecast's block (``every``).
        rollout_config: verl's rollout section (``n``, ``temperature``, ``response_length``).
    """

    def __init__(self, settings: ForecastSettings, rollout_config: Any) -> None:
        self.settings = settings
        self.plan = EvalPlan(
            int(rollout_config.n), float(rollout_config.temperature), int(rollout_config.response_length)
        )
        self.calls = 0  # training calls seen (a resumed run counts from its first step again, as the actor did)

    def due(self, prompts: DataProto) -> bool:
        """Whether this ``generate_sequences`` call gets an E: a training call (not validation, not REMAX's greedy
        baseline) whose number is 1, 1 + every, ..."""
        meta = prompts.meta_info
        if meta.get("validate", False) or meta.get("do_sample", True) is False:
            return False
        self.calls += 1
        return (self.calls - 1) % self.settings.every == 0

    def mark(self, prompts: DataProto) -> None:
        """Put :attr:`plan` on the first row of each of E's uids of ``prompts`` (``ForecastSettings.eval_uids``;
        ``FORECAST_EVAL_PLAN_KEY``, None elsewhere).

        Raises:
            ValueError: ``prompts`` has no ``uid``.
        """
        if "uid" not in prompts.non_tensor_batch:
            raise ValueError(
                "entropy forecast: the rollout's prompts have no non_tensor_batch['uid'] (verl's group id)"
            )
        row_uids = [str(uid) for uid in prompts.non_tensor_batch["uid"]]
        unmarked = set(self.settings.eval_uids(row_uids))
        column = np.empty(len(prompts), dtype=object)
        for i, uid in enumerate(row_uids):
            column[i] = self.plan if uid in unmarked else None
            unmarked.discard(uid)
        prompts.non_tensor_batch[FORECAST_EVAL_PLAN_KEY] = column

    def collect(self, prompts: DataProto, output: DataProto) -> tuple[EvalResponses | None, dict[str, float]]:
        """E from the workers' column of ``output`` (both columns leave ``prompts`` and ``output``), and its metrics:
        ``probe/eval_gen_s`` (the longest prompt's E, first request to last response: they overlap the batch's
        rollout) and ``probe/eval_gen_token_share`` (E's tokens over E's and the batch's response tokens). A uid
        whose E is missing (its first row failed before its prompt was known) or has an empty response is left out,
        with a warning; ``None`` when none is left.
        """
        prompts.non_tensor_batch.pop(FORECAST_EVAL_PLAN_KEY)
        # verl copies the prompts' columns into the output (without reward-loop workers, agent_loop.py:833)
        output.non_tensor_batch.pop(FORECAST_EVAL_PLAN_KEY, None)
        row_uids = [str(uid) for uid in prompts.non_tensor_batch["uid"]]  # the output's rows are the prompts', in order
        sampled: dict[str, SampledEval] = {}
        for uid, item in zip(row_uids, output.non_tensor_batch.pop(FORECAST_EVAL_KEY), strict=True):
            if item is not None:
                sampled.setdefault(uid, item)
        all_uids = self.settings.eval_uids(row_uids)
        uids = [u for u in all_uids if u in sampled and all(len(r) > 0 for r in sampled[u].response_ids)]
        if len(uids) < len(all_uids):
            left_out = sorted(set(all_uids) - set(uids))
            logger.warning("entropy forecast: no usable E for uids %s; E has the other prompts", left_out)
        if not uids:
            return None, {}
        eval_tokens = sum(len(r) for u in uids for r in sampled[u].response_ids)
        batch_tokens = int(output.batch["attention_mask"][:, -output.batch["responses"].shape[1] :].sum())
        metrics = {
            "probe/eval_gen_s": max(sampled[u].seconds for u in uids),
            "probe/eval_gen_token_share": eval_tokens / (eval_tokens + batch_tokens),
        }
        E = EvalResponses(
            uids,
            [sampled[u].prompt_ids for u in uids],
            [sampled[u].response_ids for u in uids],
            self.plan.budget,
            [sampled[u].request_ids for u in uids],
        )
        return E, metrics
