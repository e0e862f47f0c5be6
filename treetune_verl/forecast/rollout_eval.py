# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""E from the rollout: the forecast's fresh responses sampled by the rollout's sglang servers, beside the step's batch.

Shape notation: B = the step's distinct prompts (uids), G = responses per prompt (``rollout.n``), R = the response
budget (``rollout.response_length``).

On a training step the forecast runs (every ``every``-th ``generate_sequences`` call of the manager that trains, the
1st, (1 + k)-th, ...), the manager (``verl/v0_7_1/entropy_manager.py``) marks the first row of each of E's uids
(``ForecastSettings.eval_uids``) with an :class:`EvalPlan`; the agent-loop worker that runs the row
(``verl/v0_7_1/forecast_eval_worker.py``), when the row's agent loop sends its first turn, sends G requests of E's own
for that prompt, at the rollout's temperature over the whole vocabulary (top-p 1, top-k off: the policy verl's actor
computes its log-probabilities with, which the forecast differentiates), up to R new tokens, in the same server
batches as the step's rows. E is not rows of the batch: it goes to the actor in ``meta_info[FORECAST_EVAL_META_KEY]`` (:class:`EvalResponses`; ``None`` on a
step without a forecast), so no loss, advantage, reward or metric of verl's sees it. E is independent of the batch's
responses U: separate requests, separate samples from the same weights θ.

On verl 0.9.1 (V1 trainer) the same plan goes to the V1 workers as a column of the prompts
(``verl/v0_9_1/forecast_eval_worker.py``) and E comes back through TransferQueue (``verl/v0_9_1/rollout_eval.py``) into the
actor batch's ``extra_info[FORECAST_EVAL_META_KEY]``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import numpy as np
from verl import DataProto

from treetune_verl.batch_keys import FORECAST_EVAL_KEY, FORECAST_EVAL_PLAN_KEY, ROLLOUT_ABORTED_KEY
from treetune_verl.forecast.settings import ForecastSettings
from treetune_verl.rollout.session import EVAL_SESSION
from treetune_verl.rollout.token_output import ABORTED_STOP_REASON

REQUEST_PREFIX = "forecast-eval-"  # E's requests' sticky keys
# verl 0.7.1: the step's wait for E once every row of the batch had settled (the manager's; E of the kept groups still
# decoding when over-sampling reached its target is the forecast's cost, not over-sampling's)
EVAL_WAIT_METRIC = "probe/eval_wait_s"
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

    def to_record(self) -> dict[str, Any]:
        """Plain Python values (lists of ints, strings, a float): what survives a store that keeps no classes
        (verl 0.9.1's TransferQueue turns a dataclass into a dict of its fields)."""
        return {
            "prompt_ids": self.prompt_ids.tolist(),
            "response_ids": [response.tolist() for response in self.response_ids],
            "request_ids": list(self.request_ids),
            "seconds": float(self.seconds),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SampledEval:
        """The inverse of :meth:`to_record`."""
        return cls(
            np.asarray(record["prompt_ids"], dtype=np.int32),
            [np.asarray(response, dtype=np.int32) for response in record["response_ids"]],
            list(record["request_ids"]),
            float(record["seconds"]),
        )


class EvalCut(Exception):
    """A request of E came back cut by an abort (its group was dropped by over-sampling): E of that prompt is
    incomplete, and is left out."""


async def sample_eval(client: Any, prompt_ids: list[int], plan: EvalPlan) -> SampledEval:
    """``plan.n`` responses to ``prompt_ids``, each from a request of its own (sticky key ``forecast-eval-...``) sent
    through verl's server ``client`` (``generate(request_id, prompt_ids=..., sampling_params=...)``: verl 0.7.1's
    ``AsyncLLMServerManager``, verl 0.9.1's ``LLMServerClient``).

    Raises:
        EvalCut: a request stopped with ``"abort"`` (a cut response would bias E toward short answers).
    """
    start = time.perf_counter()
    keys = [f"{REQUEST_PREFIX}{uuid4().hex}" for _ in range(plan.n)]
    outputs = await asyncio.gather(
        *[client.generate(key, prompt_ids=prompt_ids, sampling_params=plan.sampling_params()) for key in keys]
    )
    cut = sum(out.stop_reason == ABORTED_STOP_REASON for out in outputs)
    if cut:
        raise EvalCut(f"{cut} of E's {plan.n} requests were cut by an abort")
    responses = [np.asarray(out.token_ids, dtype=np.int32) for out in outputs]
    return SampledEval(np.asarray(prompt_ids, dtype=np.int32), responses, keys, time.perf_counter() - start)


def start_sampling(
    tasks: dict[str, asyncio.Task],
    uid: str,
    prompt_ids: list[int],
    plan: EvalPlan,
    client: Any,
    abort_with: str | None = None,
) -> None:
    """Start ``uid``'s E (:func:`sample_eval`) in ``tasks``, unless started already (once per uid) or the prompt is
    empty.

    The task runs in a fresh ``contextvars.Context``: E's requests are not turns of the row's session and do not call
    the row's prompt hook. ``abort_with``: the session (``rollout/session.py``) whose abort also cuts E's requests
    (:data:`~treetune_verl.rollout.session.EVAL_SESSION`): over-sampling drops a group by aborting its session,
    and its E then ends with it instead of decoding on while the step waits.
    """
    if uid in tasks or len(prompt_ids) == 0:
        return
    context = contextvars.Context()
    if abort_with is not None:
        context.run(EVAL_SESSION.set, abort_with)
    tasks[uid] = asyncio.get_running_loop().create_task(sample_eval(client, list(prompt_ids), plan), context=context)


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
        self.marked: list[str] = []  # E's uids of the latest call that got one, until its E is taken

    def due(self, prompts: DataProto) -> bool:
        """Whether this ``generate_sequences`` call gets an E: a training call (not validation, not REMAX's greedy
        baseline) whose number is 1, 1 + every, ..."""
        meta = prompts.meta_info
        return self.training_call_due(not meta.get("validate", False) and meta.get("do_sample", True) is not False)

    def training_call_due(self, training: bool) -> bool:
        """Count a ``generate_sequences`` call (``training``: a training call) and say whether it gets an E: the
        training calls numbered 1, 1 + every, ..."""
        if not training:
            return False
        self.calls += 1
        return (self.calls - 1) % self.settings.every == 0

    def plans(self, row_uids: list[str]) -> list[EvalPlan | None]:
        """:attr:`plan` for the first row of each of E's uids among the rows' ``row_uids``
        (``ForecastSettings.eval_uids``), None for every other row; E's uids kept in :attr:`marked`."""
        self.marked = self.settings.eval_uids(row_uids)
        unmarked = set(self.marked)
        column: list[EvalPlan | None] = []
        for uid in row_uids:
            column.append(self.plan if uid in unmarked else None)
            unmarked.discard(uid)
        return column

    def mark(self, prompts: DataProto) -> None:
        """Put :meth:`plans` on ``prompts`` (``FORECAST_EVAL_PLAN_KEY``).

        Raises:
            ValueError: ``prompts`` has no ``uid``.
        """
        if "uid" not in prompts.non_tensor_batch:
            raise ValueError(
                "entropy forecast: the rollout's prompts have no non_tensor_batch['uid'] (verl's group id)"
            )
        column = np.empty(len(prompts), dtype=object)
        column[:] = self.plans([str(uid) for uid in prompts.non_tensor_batch["uid"]])
        prompts.non_tensor_batch[FORECAST_EVAL_PLAN_KEY] = column

    def collect(self, prompts: DataProto, output: DataProto) -> tuple[EvalResponses | None, dict[str, float]]:
        """E from the workers' column of ``output`` (both columns leave ``prompts`` and ``output``) and its metrics
        (:meth:`responses`; the trained uids: those with a row that over-sampling did not abort)."""
        prompts.non_tensor_batch.pop(FORECAST_EVAL_PLAN_KEY)
        # verl copies the prompts' columns into the output (without reward-loop workers, agent_loop.py:833)
        output.non_tensor_batch.pop(FORECAST_EVAL_PLAN_KEY, None)
        row_uids = [str(uid) for uid in prompts.non_tensor_batch["uid"]]  # the output's rows are the prompts', in order
        sampled: dict[str, SampledEval] = {}
        for uid, item in zip(row_uids, output.non_tensor_batch.pop(FORECAST_EVAL_KEY), strict=True):
            if item is not None:
                sampled.setdefault(uid, item)
        batch_tokens = int(output.batch["attention_mask"][:, -output.batch["responses"].shape[1] :].sum())
        trained = None  # without over-sampling's column every row trains
        aborted = output.batch.get(ROLLOUT_ABORTED_KEY, None)
        if aborted is not None:
            trained = {uid for uid, cut in zip(row_uids, aborted.tolist(), strict=True) if not cut}
        return self.responses(sampled, batch_tokens, trained)

    def responses(
        self, sampled: dict[str, SampledEval], batch_tokens: int, trained: Collection[str] | None = None
    ) -> tuple[EvalResponses | None, dict[str, float]]:
        """E of the uids :meth:`plans` marked, from the workers' ``sampled`` E by uid, and its metrics:
        ``probe/eval_gen_s`` (the longest prompt's E, first request to last response: they overlap the batch's
        rollout) and ``probe/eval_gen_token_share`` (E's tokens over E's and the batch's ``batch_tokens`` response
        tokens). A uid whose E is missing (its first row failed before its prompt was known, or its group was not
        settled when the step trained) or has an empty response is left out, with a warning unless ``trained`` (the
        uids of the step's trained groups, when over-sampling dropped others) leaves it out: a dropped group's E was
        cut with it (:class:`EvalCut`). ``None`` when none is left. :attr:`marked` is emptied.
        """
        marked, self.marked = self.marked, []
        uids = [u for u in marked if u in sampled and all(len(r) > 0 for r in sampled[u].response_ids)]
        missing = set(marked) - set(uids)
        if trained is not None:
            missing &= set(trained)
        if missing:
            logger.warning("entropy forecast: no usable E for uids %s; E has the other prompts", sorted(missing))
        if not uids:
            return None, {}
        eval_tokens = sum(len(r) for u in uids for r in sampled[u].response_ids)
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
