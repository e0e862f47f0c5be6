# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1: over-sampling with abort as a V1 replay buffer: train the first whole groups, abort the rest.

verl 0.9.1's V1 trainer takes each step's batch from a replay buffer over TransferQueue: the agent-loop workers put
every row there as it finishes and mark its prompt (one ``uid``, ``rollout.n`` rows) ``finished`` once all its rows
have; the sync buffer (``trainer/ppo/v1/replay_buffer.py`` ``ReplayBuffer.sample``) waits for ``train_batch_size``
finished groups. verl names the place to change that, ``trainer.v1.sampler.custom_sampler.{path,name}`` (a
``ReplayBuffer`` subclass, built in ``PPOTrainer.__init__``). :class:`OverSampleReplayBuffer` is ours: at a training
step with ``rollout.over_sample_rate = r > 0`` it

1. waits, through verl's own ``sample``, for ``target = ceil((1 - r) * groups)`` finished groups
   (:func:`~treetune_verl.trainer.features.completion_target`) and takes them: whole groups, by construction. A
   group one of whose rows raised (verl marks it ``failure`` and would train it without that row) is never taken;
   if failures leave fewer than ``target`` groups that can still finish, the step stops with an error naming them,
   or, with failed rows aborted (``rollout.custom.over_sample.abort_failed_rows=true``), takes those that finish;
2. aborts every other group of the step on the policy's servers, by the session its uid names
   (:func:`~treetune_verl.rollout.session.group_session_id`; the workers send each training turn under it,
   ``verl/v0_9_1/over_sample_worker.py``): running turns stop, queued and later turns come back at once, empty;
3. waits until each of those groups is terminal (nothing of it writes to TransferQueue any more), removes them and
   their rows from TransferQueue, and has the servers forget the sessions.

The aborted groups never reach the trainer: every estimator, the critic and the loss see verl's batch of whole groups,
smaller than ``train_batch_size``, which verl pads to its mini-batch multiple with its own padding rows
(``_balance_batch``; what that means per estimator and loss mode: ``ppo/advantage.py``). With failed rows aborted and
``r = 0`` the target is every group: the step waits for all of them, trains the whole ones and drops the failed ones
(verl would train them without the rows that raised). Validation batches, and ``r = 0`` without it, are verl's
``sample`` unchanged. Metrics (the step's, through verl's ``sample`` result; the same keys as verl 0.7.1's manager,
``trainer/metrics.py`` ``abort_metrics``): ``rollout/kept_groups``, ``rollout/aborted_groups``,
``rollout/failed_groups`` (aborted ones with a row that raised), ``rollout/aborted_rows`` (every row of a dropped
group: finished, cut, or raised), ``rollout/failed_rows`` (the rows that raised: a failed group is short of them in
TransferQueue), ``rollout/aborted_ratio`` (of the step's rows), ``rollout/aborted_tokens`` (the tokens the aborted rows
had), ``rollout/abort_wait_s`` (from the target to the last aborted group settled and forgotten: the step's wait on
over-sampling, ``timing_s/treetune/over_sampling``, as verl 0.7.1's manager measures it; ``treetune_verl/timing.py``);
the trainer's seams add the reward's two views (``rollout/score/*``).

With carry-over (``rollout.custom.over_sample.carry_over=true``) step 2 aborts only the groups that cannot train at
the next step: failed ones, and those whose first tokens would then be more than ``max_staleness`` steps old (a group
dispatched at step ``s`` samples with the weights of step ``s - 1``); the others stay in TransferQueue, running:
the trainer pauses the servers at the end of sampling and resumes them after the weight update (its seams,
``trainer_seams.py``, which also dispatch only ``train_batch_size - carried`` fresh prompts at the next step), their
client resumes each cut turn (``verl/v0_9_1/resuming_client.py``), and verl's ``sample`` takes the oldest finished
groups first. A group dropped that way loses its prompt (verl's dataloader moves on; the pinned stack restarts it).
Metrics ``rollout/carry_over/``: ``groups_carried`` (left running), ``groups_resumed`` (kept groups of an earlier
step), ``tokens_trained`` (kept tokens of earlier weights) and ``staleness/<k>`` (kept tokens sampled ``k`` updates
ago).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import ray
from omegaconf import OmegaConf

from treetune_verl.batch_keys import TOKEN_GLOBAL_STEPS_KEY
from treetune_verl.rollout.session import group_session_id
from treetune_verl.timing import OVER_SAMPLING, SECONDS
from treetune_verl.trainer.features import FAILED_ROWS_KEY, SAMPLER_NAME, RunFeatures, completion_target
from treetune_verl.trainer.metrics import abort_metrics
from treetune_verl.verl.v0_9_1.process_setup import policy_server_manager
from treetune_verl.verl_guard import VERL_CURRENT

VERL_CURRENT.require("V1 over-sampling replay buffer")  # verl 0.7.1 over-samples in its agent-loop manager

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer  # noqa: E402

__all__ = ["ABORT_POLL_S", "OverSampleReplayBuffer", "POLL_S"]

# verl polls TransferQueue every 2 s; the step's tail is what over-sampling cuts, so it looks more often (one
# metadata listing per poll, no row data).
POLL_S = 0.1
# After the abort the step waits for the aborted groups alone, and each arrives about one decode step (~0.1 s with
# SmolLM2 on CPU) after the abort: at POLL_S the wait rounded up to the next 0.1 s (issue 49's bench: 2 polls, 0.2 s,
# for requests back after 0.12 s). A listing costs ~1 ms of the trainer's CPU, and the phase lasts a decode step or two.
ABORT_POLL_S = 0.01
logger = logging.getLogger(__name__)
CARRY_PREFIX = "rollout/carry_over/"  # the pinned stack's names (agent_loop/carry_over.py)


class _TargetOutOfReach(Exception):
    """Failed groups leave only ``reachable`` groups of the step able to finish (failed rows aborted)."""

    def __init__(self, reachable: int) -> None:
        super().__init__(reachable)
        self.reachable = reachable


class OverSampleReplayBuffer(ReplayBuffer):
    """verl's sync replay buffer that trains the first ``target`` whole groups of a step and aborts the others.

    The rate, carry-over and its staleness bound are those of the config the policy's servers were built with (the
    trainer's).

    Raises:
        ValueError: a trainer mode other than ``sync`` (an async trainer's buffer keeps groups across steps).
    """

    def __init__(
        self,
        trainer_mode: str,
        *args: Any,
        poll_interval: float = POLL_S,
        abort_poll_interval: float = ABORT_POLL_S,
        **kwargs: Any,
    ) -> None:
        if trainer_mode != "sync":
            raise ValueError(
                f"over-sampling's replay buffer ({SAMPLER_NAME}) runs in trainer.v1.trainer_mode=sync; got "
                f"{trainer_mode!r}"
            )
        super().__init__(trainer_mode, *args, poll_interval=poll_interval, **kwargs)
        self.abort_poll_interval = abort_poll_interval  # between listings while aborted groups settle
        self.features: RunFeatures | None = None  # read from the servers' config at the first sample
        self.carried = 0  # groups left running by the last training step (carry-over), for the next dispatch
        self._target: int | None = None  # groups to keep, during an over-sampled step's sample
        self.last_rows: tuple[int, int] | None = None  # the last training step's (kept, aborted) rows
        # carry-over: the step's groups left running, and its metrics until the trainer logs them (after the pause)
        self._carried_sessions: list[str] = []
        self.carry_metrics: dict[str, float] = {}

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        """verl's ``sample`` of ``target`` groups, the step's other groups aborted and removed (with carry-over: the
        stale and failed ones only, the others left running); see the module."""
        features = self._features()
        if partition_id != "train" or not features.aborts_rows:
            return super().sample(global_steps, partition_id, batch_size)
        self._target = completion_target(features.over_sample_rate, batch_size)
        try:
            batch, metrics = self._sample_target(global_steps, partition_id)
        finally:
            self._target = None
        started = len(batch)  # the kept groups' rows
        kept = {key.split("_")[0] for key in batch.keys}
        reached = time.perf_counter()
        # From the target on, the step waits on us (timing.py: the block's wall is the step's wait, its thread CPU our
        # work); waiting for the target is verl's.
        with SECONDS.timed(OVER_SAMPLING):
            self._sync_metadata_from_transfer_queue()
            others = self._groups(partition_id)
            dropped, self.carried = others, 0
            if features.carry_over:
                stale = self._stale_groups(global_steps, partition_id, others)
                dropped = stale | self.failure_keys[partition_id]
                self.carried = len(others - dropped)
                metrics.update(self._carry_metrics(global_steps, batch))
            failed, rows, tokens = self._abort_groups(partition_id, dropped)
            if features.carry_over:
                self._ledger_at_sample(kept, dropped, stale - failed, others - dropped)
            # the rows that raised never reached TransferQueue: a failed group is short of them
            failed_rows = len(failed) * self._rows_per_group() - sum(rows[group] for group in failed) if failed else 0
        if failed:
            logger.warning(
                "step %d: %d group(s) dropped, a row of each raised in its agent loop (tracebacks in the agent-loop "
                "workers' log)",
                global_steps,
                len(failed),
            )
        aborted_rows = sum(rows.values()) + failed_rows
        self.last_rows = (started, aborted_rows)  # for the reward's metrics, once the kept rows are scored
        metrics.update(
            abort_metrics(
                kept_groups=len(kept),
                aborted_groups=len(dropped),
                failed_groups=len(failed),
                kept_rows=started,
                aborted_rows=aborted_rows,
                failed_rows=failed_rows,
                aborted_tokens=tokens,
                abort_wait_s=time.perf_counter() - reached,
            )
        )
        return batch, metrics

    def _sample_target(self, global_steps: int, partition_id: str) -> tuple[Any, dict]:
        """verl's ``sample`` of ``self._target`` groups; with failed rows aborted, of fewer when failures leave fewer
        able to finish."""
        while True:
            try:
                return super().sample(global_steps, partition_id, self._target)
            except _TargetOutOfReach as out_of_reach:
                self._target = out_of_reach.reachable

    def _features(self) -> RunFeatures:
        """The run's features, from the config the policy's servers were built with (the trainer's)."""
        if self.features is None:
            self.features = RunFeatures.from_config(policy_server_manager().config, rollout_entropy=True)
        return self.features

    def _stale_groups(self, global_steps: int, partition_id: str, groups: set[str]) -> set[str]:
        """The groups that would train at the next step with tokens older than ``max_staleness`` steps: a group
        dispatched at step ``s`` samples its first tokens with the weights of step ``s - 1``."""
        dispatched = self.prompt_global_steps[partition_id]
        bound = self._features().max_staleness
        return {uid for uid in groups if global_steps + 1 - dispatched.get(uid, global_steps) > bound}

    def _carry_metrics(self, global_steps: int, batch: Any) -> dict[str, float]:
        """The kept rows' tokens by staleness (training step - 1 - the weight version that sampled them), the kept
        rows and groups that resumed from an earlier step, and the groups left running for the next step.

        Raises:
            RuntimeError: a kept row's token has no weight version (the servers' ``global_steps`` was never set).
        """
        row_steps = self._token_steps(batch)
        if any(None in steps for steps in row_steps):
            raise RuntimeError(
                "carry-over: a kept row has tokens of unknown weight version (the trainer's seams set the servers' "
                "global_steps, verl/v0_9_1/trainer_seams.py)"
            )
        staleness = Counter(global_steps - 1 - step for steps in row_steps for step in steps)
        resumed = {
            key.split("_")[0]
            for key, tag in zip(batch.keys, batch.tags, strict=True)
            if tag["global_steps"] < global_steps
        }
        metrics = {f"{CARRY_PREFIX}staleness/{age}": count for age, count in sorted(staleness.items())}
        metrics[f"{CARRY_PREFIX}groups_resumed"] = len(resumed)
        metrics[f"{CARRY_PREFIX}rows_trained"] = sum(
            any(step < global_steps - 1 for step in steps) for steps in row_steps
        )
        metrics[f"{CARRY_PREFIX}tokens_trained"] = sum(count for age, count in staleness.items() if age > 0)
        metrics[f"{CARRY_PREFIX}groups_carried"] = self.carried
        return metrics

    def _ledger_at_sample(self, kept: set[str], dropped: set[str], stale: set[str], carried: set[str]) -> None:
        """The servers' token ledger when ``sample`` returns: the kept and dropped groups are resolved (their sessions
        forgotten there; the dropped ones' tokens are discarded, the stale ones among them counted apart), the
        carried ones are read after the trainer's pause (:meth:`finish_carry_metrics`)."""
        self._session_tokens([group_session_id(uid) for uid in kept], forget=True)
        discarded_stale = self._session_tokens([group_session_id(uid) for uid in stale], forget=True)
        discarded = discarded_stale + self._session_tokens(
            [group_session_id(uid) for uid in dropped - stale], forget=True
        )
        self._carried_sessions = [group_session_id(uid) for uid in sorted(carried)]
        self.carry_metrics = {
            f"{CARRY_PREFIX}tokens_discarded": discarded,
            f"{CARRY_PREFIX}tokens_discarded_stale": discarded_stale,
            f"{CARRY_PREFIX}rows_restarted_stale": 0,  # a stale group is dropped whole here, never restarted
            # the trainer dispatches train_batch_size - carried fresh prompts (trainer_seams.py prepare_step): a drawn
            # prompt goes out in the step that drew it, none waits
            f"{CARRY_PREFIX}backlog": 0,
            f"{CARRY_PREFIX}prompt_wait_max": 0,
            f"{CARRY_PREFIX}prompt_wait_bound": 0,
        }

    def finish_carry_metrics(self) -> None:
        """After the trainer paused the servers (the carried turns' partial tokens are back): the tokens the step
        generated and those it carries, and the share of the generated ones discarded."""
        generated = self._generated_tokens()
        carried = self._session_tokens(self._carried_sessions)
        discarded = self.carry_metrics.get(f"{CARRY_PREFIX}tokens_discarded", 0)
        self.carry_metrics.update(
            {
                f"{CARRY_PREFIX}tokens_generated": generated,
                f"{CARRY_PREFIX}tokens_carried": carried,
                f"{CARRY_PREFIX}discarded_share": discarded / generated if generated else 0.0,
            }
        )

    def take_carry_metrics(self) -> dict[str, float]:
        """The step's carry-over metrics from the ledger (``{}`` if none), for the trainer's ``_compute_metrics``."""
        metrics, self.carry_metrics = self.carry_metrics, {}
        return {key: float(value) for key, value in metrics.items()}

    def _generated_tokens(self) -> int:
        """The tokens of training sessions the policy's servers generated since the last call."""
        return sum(ray.get([server.generated_tokens.remote() for server in self._server_handles()]))

    def _session_tokens(self, sessions: list[str], forget: bool = False) -> int:
        """Every token the policy's servers generated for these sessions (``rollout/token_ledger.py``)."""
        if not sessions:
            return 0
        handles = self._server_handles()
        return sum(ray.get([server.session_tokens.remote(sessions, forget) for server in handles]))

    def _server_handles(self) -> list[Any]:
        return policy_server_manager().server_handles

    def _sampleable_terminal_keys(self, partition_id: str, eviction_reasons: Any) -> set[str]:
        """verl's sampleable groups, less the failed ones while over-sampling (a failed group is not whole).

        Raises:
            RuntimeError: failed groups leave fewer than the target groups that can still finish (with failed rows
                aborted: none).
            _TargetOutOfReach: with failed rows aborted, fewer than the target can finish: ``sample`` takes those.
        """
        sampleable = super()._sampleable_terminal_keys(partition_id, eviction_reasons)
        if self._target is None:
            return sampleable
        failed = self.failure_keys[partition_id]
        sampleable = sampleable - failed
        reachable = len(sampleable) + len(self._open_groups(partition_id))
        if reachable < self._target:
            raised = (
                f"{len(failed)} group(s) of this step had a row whose agent loop raised (tracebacks in the agent-loop "
                "workers' log)"
            )
            if not self._features().abort_failed_rows:
                raise RuntimeError(
                    f"over-sampling: {raised}, so fewer than the target {self._target} whole groups can finish (set "
                    f"{FAILED_ROWS_KEY}=true to train the groups that finish)"
                )
            if reachable == 0:
                raise RuntimeError(f"every group of this step failed: {raised}; nothing to train")
            raise _TargetOutOfReach(reachable)
        return sampleable

    def _token_steps(self, batch: Any) -> list[list[int | None]]:
        """Each kept row's tokens' weight versions, read from the rows' ``extra_fields`` in TransferQueue."""
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        return [list(fields.get(TOKEN_GLOBAL_STEPS_KEY, [])) for fields in data.pop("extra_fields").tolist()]

    def _abort_groups(self, partition_id: str, groups: set[str]) -> tuple[set[str], Counter[str], int]:
        """Abort ``groups`` of ``partition_id``, wait until each is terminal, remove them; (the failed ones among
        them, each group's rows in TransferQueue, the tokens those rows had)."""
        if not groups:
            return set(), Counter(), 0
        sessions = [group_session_id(uid) for uid in groups]
        stamps = [time.perf_counter()]  # where the abort's seconds go (issue 49): the RPC, the polls, clear, forget
        self._abort(sessions)
        stamps.append(time.perf_counter())
        polls = 0
        while self._open_groups(partition_id) & groups:
            time.sleep(self.abort_poll_interval)
            self._sync_metadata_from_transfer_queue()
            polls += 1
        stamps.append(time.perf_counter())
        failed = groups & self.failure_keys[partition_id]
        rows = {key: tag for key, tag in self.partitions[partition_id].items() if key.split("_")[0] in groups}
        self._clear_groups(partition_id, groups)
        stamps.append(time.perf_counter())
        self._forget(sessions)
        stamps.append(time.perf_counter())
        rpc, settle, clear, forget = (b - a for a, b in zip(stamps, stamps[1:], strict=False))
        logger.info(
            "abort latency: %d group(s): abort RPC %.3f s, settled after %d poll(s) %.3f s, clear %.3f s, forget %.3f s",
            len(groups),
            rpc,
            polls,
            settle,
            clear,
            forget,
        )
        per_group = Counter(key.split("_")[0] for key in rows)
        return failed, per_group, sum(tag.get("response_len", 0) for tag in rows.values())

    def _rows_per_group(self) -> int:
        """A group's rows: ``rollout.n`` sessions of ``rows_per_session`` rows each (managed sessions)."""
        n = OmegaConf.select(policy_server_manager().config, "actor_rollout_ref.rollout.n", default=1)
        return int(n) * self._features().rows_per_session

    def _abort(self, sessions: list[str]) -> None:
        """Abort these sessions on every server of the policy (a group's turns may have gone to any of them)."""
        ray.get([server.abort_sessions.remote(sessions) for server in self._server_handles()])

    def _forget(self, sessions: list[str]) -> None:
        ray.get([server.forget_sessions.remote(sessions) for server in self._server_handles()])

    def _groups(self, partition_id: str) -> set[str]:
        terminal = self.finished_keys[partition_id] | self.failure_keys[partition_id]
        return self._open_groups(partition_id) | terminal

    def _open_groups(self, partition_id: str) -> set[str]:
        return self.pending_keys[partition_id] | self.running_keys[partition_id]
