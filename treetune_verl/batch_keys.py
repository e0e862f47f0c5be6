# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The names of everything treetune puts on verl's ``AgentLoopOutput`` / ``DataProto``: one place, no dependencies.

Shape notation: ``B`` = rows of the batch, ``R`` = ``response_length``. A shared leaf: every layer may import it,
and it imports nothing.

Entropy's path: an entropy agent loop -> ``AgentLoopOutput.extra_fields[RESPONSE_ENTROPY_KEY]`` (list[float], one
per response token) -> the worker -> ``DataProto.batch[ROLLOUT_ENTROPY_KEY]`` (float32 ``[B, R]``, nats).
"""

RESPONSE_ENTROPY_KEY = "response_entropy"  # AgentLoopOutput.extra_fields, loop -> worker (popped by the worker)
# AgentLoopOutput.extra_fields, entropy mode "support" (issue 48): per response token (size, kept_mass,
# sampled_logprob, token_ids | None), the support sglang sampled it from (sglang/support.py TOKEN_SUPPORT_FIELDS)
RESPONSE_SUPPORT_KEY = "response_support"
ROLLOUT_ENTROPY_KEY = "rollout_entropy"  # DataProto.batch, float32 [B, R], nats
# DataProto.batch, bool [B]: False for rows whose loop carries no entropy (a stock verl loop). Their rollout_entropy
# row is all 0.0, which is not a measured entropy: metrics and consumers must leave them out.
HAS_ROLLOUT_ENTROPY_KEY = "has_rollout_entropy"
# DataProto.batch, bool [B]: True for rows cut by over-sampling with abort (rollout.over_sample_rate > 0). Such a row
# carries nothing into training: its response is empty (attention and response_mask 0) and its reward is 0.
ROLLOUT_ABORTED_KEY = "rollout_aborted"
# DataProto.batch, bool [B]: True for the rows whose agent loop raised (rollout.custom.over_sample.abort_failed_rows);
# they are aborted rows too (ROLLOUT_ABORTED_KEY), and so are the other rows of their group.
ROLLOUT_FAILED_KEY = "rollout_failed"
# DataProto.batch, int64 [B] (verl 0.7.1's worker -> manager, popped there): the response tokens an aborted row had
# when it stopped (0 for kept rows), for rollout/aborted_tokens.
ROLLOUT_ABORTED_TOKENS_KEY = "rollout_aborted_tokens"
# DataProto.batch, int64 [B] (carry-over only): how many leading response tokens of a trained row were sampled at
# earlier steps (by older weights); 0 for fresh and aborted rows.
ROLLOUT_RESUMED_TOKENS_KEY = "rollout_resumed_tokens"
# DataProto.meta_info: {metric name: float} to add to this step's metrics (read by the trainer's
# compute_data_metrics seam, treetune_verl/verl/v0_7_1/trainer_seams.py).
PENDING_METRICS_KEY = "treetune_step_metrics"
# DataProto.meta_info of a training batch's prompts: {"counter", "step", "target", "abort_failed_rows", "carry_over",
# "global_step"} for the agent-loop workers (over-sampling with abort, agent_loop/over_sample.py plan_of).
OVER_SAMPLE_META_KEY = "treetune_over_sample"
# AgentLoopOutput.extra_fields, loop -> worker (popped by the worker): {"stop_reason", "sampling_params"} of the loop's
# last request ("abort": cut), set by the loops whose rows can be resumed (carry-over).
RESUME_KEY = "treetune_resume"
# DataProto.non_tensor_batch of a training batch's prompts, object [B] (CarriedRow or None): what a row resumes from
# (over-sampling with carry-over; manager -> worker, popped by the manager from the output).
CARRIED_ROW_KEY = "treetune_carried_row"
# DataProto.non_tensor_batch of the output, object [B] (CarriedRow or None): what an aborted row generated, for the
# next step (worker -> manager, popped by the manager).
CARRY_RECORD_KEY = "treetune_carry_record"
# DataProto.non_tensor_batch, object [B] ({feature: seconds} or None): the seconds an agent-loop worker spent in our
# code for the batch (on its first row), popped by the manager (treetune_verl/timing.py).
TIMING_KEY = "treetune_timing_s"
# verl 0.7.1, DataProto.non_tensor_batch of the output, object [B] (float or None): when an agent-loop worker's rows had
# all settled (``time.time()``, on its first row), before it waited for the forecast's E; popped by the manager, which
# ends over-sampling's abort wait there (the step's wait for E of the kept groups after it is the forecast's).
ROWS_SETTLED_AT_KEY = "treetune_rows_settled_at"
# verl 0.9.1 carry-over: each response token's weight version (the server's ``global_steps`` when it was sampled: the
# training step whose update produced the weights), AgentLoopOutput.extra_fields, list[int] aligned with the response
TOKEN_GLOBAL_STEPS_KEY = "token_global_steps"
# Managed sessions: AgentLoopOutput.extra_fields -> DataProto.non_tensor_batch, object [B] ({"rows", "branches",
# "turns", "tool_calls", "agent_score"} of a managed session's row, None for other rows), popped by the manager for
# the step's managed/* metrics.
MANAGED_ROW_KEY = "treetune_managed_row"

# DataProto.meta_info, rollout -> actor on a training step with the live forecast: E's responses sampled by the rollout's
# servers (forecast/rollout_eval.py EvalResponses), None on a step without a forecast; never a row of the batch
FORECAST_EVAL_META_KEY = "treetune_forecast_eval"
# DataProto.non_tensor_batch, object [B], the live forecast's E (forecast/rollout_eval.py): manager -> worker, the
# EvalPlan on the first row of each of E's uids (None elsewhere); worker -> manager, that uid's SampledEval on that row
FORECAST_EVAL_PLAN_KEY = "treetune_forecast_eval_plan"
FORECAST_EVAL_KEY = "treetune_forecast_eval_sampled"
