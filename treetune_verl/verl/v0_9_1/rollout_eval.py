# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: E from the V1 rollout, from the agent-loop workers to the trainer through a TransferQueue partition.

In verl 0.9.1's V1 trainer no batch comes back from the rollout: the workers put each row into TransferQueue and the
trainer's replay buffer takes a step's finished groups from there. So E takes the same road, beside the rows: the
worker that sampled a uid's E puts it into :data:`EVAL_PARTITION` under the uid (:func:`put_sampled`) before that
uid's first row, so a finished group's E is there; the trainer's seam on ``_update_actor`` takes the E of the uids
the manager marked this step (:func:`take_rollout_eval`) and empties the partition. E is never a row of ``train``:
no loss, advantage, reward or metric of verl's reads it.
"""

from __future__ import annotations

from treetune_verl.batch_keys import FORECAST_EVAL_KEY
from treetune_verl.forecast.rollout_eval import EvalResponses, RolloutEval, SampledEval

__all__ = ["EVAL_PARTITION", "put_sampled", "take_rollout_eval"]

EVAL_PARTITION = "treetune_forecast_eval"  # TransferQueue partition: key = uid, field FORECAST_EVAL_KEY


async def put_sampled(uid: str, sampled: SampledEval) -> None:
    """Put one uid's E into :data:`EVAL_PARTITION` (as plain values: :meth:`SampledEval.to_record`)."""
    import transfer_queue as tq
    from tensordict import NonTensorStack, TensorDict

    fields = TensorDict({FORECAST_EVAL_KEY: NonTensorStack(sampled.to_record())}, batch_size=[1])
    await tq.async_kv_put(key=uid, partition_id=EVAL_PARTITION, fields=fields)


def take_rollout_eval(
    rollout_eval: RolloutEval, batch_tokens: int, trained: set[str]
) -> tuple[EvalResponses | None, dict[str, float]]:
    """E of the uids ``rollout_eval`` marked at this step (:meth:`RolloutEval.responses`: a uid whose E is not in the
    partition is left out, with a warning if it is one of the ``trained`` uids) and its metrics (``batch_tokens``: the
    step's response tokens); every E in the partition is removed (one that a carried group put late, at an earlier
    step, included)."""
    import transfer_queue as tq

    present = list(tq.kv_list(partition_id=EVAL_PARTITION).get(EVAL_PARTITION, {}))
    wanted = [uid for uid in rollout_eval.marked if uid in present]
    sampled: dict[str, SampledEval] = {}
    if wanted:
        data = tq.kv_batch_get(keys=wanted, partition_id=EVAL_PARTITION, select_fields=[FORECAST_EVAL_KEY])
        records = data.get(FORECAST_EVAL_KEY).tolist()
        sampled = {uid: SampledEval.from_record(record) for uid, record in zip(wanted, records, strict=True)}
    if present:
        tq.kv_clear(keys=present, partition_id=EVAL_PARTITION)
    return rollout_eval.responses(sampled, batch_tokens, trained)
