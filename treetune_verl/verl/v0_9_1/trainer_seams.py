# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Every treetune hook in verl 0.9.1's V1 trainer process: one wrapper per seam, the features it runs in order.

Installed by ``process_setup.py`` in the trainer's process once the run's config selects rollout entropy (before the
servers start). Each seam is one method of the V1 base trainer ``PPOTrainer`` (``verl/trainer/ppo/v1/
trainer_base.py``), wrapped through ``treetune_verl.patching`` (idempotent, guarded by verl's version and the exact
signature). verl 0.9.1 offers ``register_trainer`` for a trainer of one's own, but its registry is read before any
code of ours runs in that process (``main_ppo.py`` ``TaskRunnerV1.run``), short of a ``verl.plugins`` entry point
that every verl process of every user would import (spec):

==============================================  =================================================================
seam                                            what runs after verl's own, in order
==============================================  =================================================================
``PPOTrainer.prepare_step`` (``:1525``)          instead of verl's, with carry-over groups running: dispatch
                                                   ``train_batch_size - carried`` fresh prompts (the replay buffer,
                                                   ``over_sample_sampler.py``, says how many it carried)
``PPOTrainer._compute_old_log_prob``            1. rollout entropy: ``rollout_entropy`` / ``has_rollout_entropy``
(``trainer_base.py:1634``; the actor's             into TransferQueue for every row of the step, built from the
``entropy`` is in TransferQueue after it)          rows' ``extra_fields`` (``entropy_rows.py``), and its metrics;
                                                2. the agreement ``rollout_entropy/actor_abs_diff/{mean,max}``
                                                   against the actor's ``entropy`` of the same tokens, when defined
                                                   (with carry-over: rows of the current weights only);
                                                3. managed sessions: ``managed/*`` of the step's rows;
                                                4. the sampled support (entropy mode ``support``):
                                                   ``rollout_support/*`` (sizes, kept mass, the actor's
                                                   importance ratio over the behaviour log-probs)
``PPOTrainer._compute_advantage`` (``:1743``;    1. steering: entropy-shaped advantage, then the forking-token mask
the advantages are in TransferQueue after it)      (``ppo/entropy_advantage.py``, one threshold for the batch's real
                                                   rows; verl's padding rows keep theirs)
``PPOTrainer._validate`` (``:1031``)            1. rollout entropy of every validation row it sampled:
                                                   ``val-aux/rollout_entropy/...``
``PPOTrainer._update_actor`` (``:1827``)        1. forecast: *before* verl's, the rollout's E of the step from
                                                   TransferQueue into ``extra_info[FORECAST_EVAL_META_KEY]`` (None:
                                                   no forecast; ``verl/v0_9_1/rollout_eval.py``) and
                                                   ``probe/eval_gen_{s,token_share}``; after, its metrics
                                                   (``probe/*``, ``timing_s/probe``) named back from ``actor/...``
                                                   (the actor seam's, ``actor_seams.py``)
``PPOTrainer._compute_metrics`` (``:1868``)     1. over-sampling: the reward's two views (``rollout/score/*``);
                                                   with carry-over the ledger's token counts
                                                2. every feature's cost this step: the step's wait on our
                                                   code and our CPU seconds (``timing_s/treetune/*``,
                                                   ``cpu_s/treetune/*``, ``treetune/share_of_step``)
``PPOTrainerSync.on_init_end`` (``trainer_sync  1. carry-over: the servers' weight version (``set_global_steps``)
.py:31``)                                          and their token ledger (``rollout/token_ledger.py``)
``PPOTrainerSync.on_sample_end`` (``:40``)       *before* verl's sleep, carry-over: pause the servers (verl's
                                                   ``abort_replicas``, as its ``colocate_async`` trainer does),
                                                   then read the ledger (tokens generated and carried)
``PPOTrainerSync.on_step_end`` (``:35``; the     1. carry-over: the new weight version, then
weights are updated after it)                      ``resume_generation_replicas``: the carried turns go on
``PPOTrainer._submit_batch_to_rollout``         instead of verl's sync branch, with carry-over: verl's async
(``:1496``), ``_save_checkpoint`` (``:948``),      branch (each prompt's data kept in TransferQueue, TransferQueue
``_reissue_inflight_prompts`` (``:910``)           saved at a checkpoint, in-flight groups re-issued at the start)
``PPOTrainer._load_checkpoint`` (``:850``)       the same, then the restored groups counted as carried
==============================================  =================================================================

Metric names are the pinned stack's (``timing_s/agent_loop/rollout_entropy/{mean,p50,p90,max,rows_without_entropy}``
there comes through verl 0.7.1's generation timing dict; ``val-aux/rollout_entropy/...``), so dashboards and checks
read both stacks alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

from treetune_verl.batch_keys import (
    FORECAST_EVAL_META_KEY,
    HAS_ROLLOUT_ENTROPY_KEY,
    MANAGED_ROW_KEY,
    RESPONSE_SUPPORT_KEY,
    ROLLOUT_ENTROPY_KEY,
    TOKEN_GLOBAL_STEPS_KEY,
)
from treetune_verl.control.controller import PREFIX as CONTROL_PREFIX
from treetune_verl.forecast.live import PREFIX as FORECAST_PREFIX
from treetune_verl.forecast.live import PROBE_TIMING
from treetune_verl.patching import Wrap, swapped
from treetune_verl.ppo.entropy_advantage import steer_advantages
from treetune_verl.rollout.rollout_config import entropy_config
from treetune_verl.timing import OVER_SAMPLING, ROLLOUT_ENTROPY, SECONDS, STEERING, TRAINER_HOOKS, step_metrics
from treetune_verl.trainer.features import RunFeatures
from treetune_verl.trainer.metrics import (
    actor_agreement_metrics,
    agreement_is_defined,
    managed_session_metrics,
    rollout_entropy_metrics,
    score_metrics,
    support_metrics,
)
from treetune_verl.verl.v0_9_1.entropy_rows import rollout_entropy_rows
from treetune_verl.verl.v0_9_1.rollout_eval import take_rollout_eval
from treetune_verl.verl_guard import VERL_CURRENT

__all__ = ["install"]

ACTOR_ENTROPY_KEY = "entropy"  # the V1 trainer's name for the actor's per-token entropy (trainer_base.py:1669)
PADDING_TAG = "is_padding"  # rows verl adds to fill the batch (verl/trainer/ppo/padding_utils.py)
RESPONSE_LEN_TAG = "response_len"  # a row's response tokens, tagged by verl's worker (agent_loop_tq.py)
TRAINING_PREFIX = "timing_s/"  # the pinned stack's names (module docstring)
VALIDATION_PREFIX = "val-aux/"
ACTOR_PREFIX = "actor/"  # what verl's _update_actor puts before every actor metric (trainer_base.py rename_dict)

# Signatures the wrappers repeat: verl 0.9.1 trainer/ppo/v1/trainer_base.py.
_COMPUTE_OLD_LOG_PROB_PARAMS = ("self", "batch", "metrics")
_COMPUTE_ADVANTAGE_PARAMS = ("self", "batch", "metrics")
_SELF = ("self",)  # prepare_step, _validate; PPOTrainerSync (trainer_sync.py) on_init_end, on_sample_end, on_step_end
_COMPUTE_METRICS_PARAMS = ("self", "batch", "metrics", "timing_raw", "global_steps", "epoch")
_SUBMIT_BATCH_PARAMS = ("self", "batch")
_REISSUE_PARAMS = ("self", "partition_id")  # _save_checkpoint, _load_checkpoint: _SELF
_UPDATE_ACTOR_PARAMS = ("self", "batch", "metrics")


def _padded(rows: list[torch.Tensor]) -> torch.Tensor:
    """``[B, max R_i]`` from per-row ``[R_i]`` tensors, right-padded with 0."""
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


def _rows(tensor: Any) -> list[torch.Tensor]:
    """Per-row tensors of a TransferQueue field (jagged nested, or dense when every row has one length)."""
    return list(tensor.unbind(0))


def _read_rows(batch: Any) -> tuple[list[dict | None], list[torch.Tensor], list[bool]]:
    """Every row's ``extra_fields``, ``response_mask`` and whether verl added it as padding, read from TransferQueue
    for ``batch`` (a ``KVBatchMeta``)."""
    import transfer_queue as tq

    fields = ["extra_fields", "response_mask"]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    padding = [bool(tag.get(PADDING_TAG, False)) for tag in batch.tags]
    extra_fields = data.pop("extra_fields").tolist()  # as verl reads it (trainer_base.py _compute_metrics)
    return extra_fields, _rows(data["response_mask"]), padding


def read_rollout_entropy(batch: Any) -> tuple[list[dict[str, torch.Tensor]], list[torch.Tensor]]:
    """Every row's ``rollout_entropy`` / ``has_rollout_entropy`` (``entropy_rows.py``) and ``response_mask``, read
    from TransferQueue for ``batch`` (a ``KVBatchMeta``)."""
    extra_fields, masks, padding = _read_rows(batch)
    return rollout_entropy_rows(batch.keys, extra_fields, masks, padding), masks


def managed_metrics(extra_fields: list[dict | None], padding: list[bool]) -> dict[str, float]:
    """:func:`managed_session_metrics` of the real rows (verl's padding rows copy a real row's ``extra_fields``)."""
    return managed_session_metrics(
        [
            None if pad else (fields or {}).get(MANAGED_ROW_KEY)
            for fields, pad in zip(extra_fields, padding, strict=True)
        ]
    )


def put_rollout_entropy(batch: Any, rows: list[dict[str, torch.Tensor]]) -> None:
    """Write the rows' two fields to TransferQueue, for the seams after this one; ``batch.fields`` then names them."""
    import transfer_queue as tq
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    fields = list_of_dict_to_tensordict(rows)
    written = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
    batch.fields = written.fields


def entropy_metrics(
    rows: list[dict[str, torch.Tensor]], masks: list[torch.Tensor], padding: list[bool] | None = None
) -> dict[str, float]:
    """:func:`rollout_entropy_metrics` of built rows (``agent_loop/rollout_entropy/...``); ``padding``: the rows verl
    added to fill the batch, left out (no rollout row of ours: ``rows_without_entropy`` counts the real rows only)."""
    if padding is not None:
        kept = [(row, mask) for row, mask, pad in zip(rows, masks, padding, strict=True) if not pad]
        rows, masks = [row for row, _ in kept], [mask for _, mask in kept]
    has = torch.stack([row[HAS_ROLLOUT_ENTROPY_KEY] for row in rows])
    entropy = _padded([row[ROLLOUT_ENTROPY_KEY] for row in rows])
    return rollout_entropy_metrics(entropy, _padded(masks), has)


def _wrap_compute_old_log_prob(original):
    def _compute_old_log_prob(self, batch, metrics):
        batch = original(self, batch, metrics)
        # 1. rollout entropy into TransferQueue, and its metrics
        with SECONDS.timed(ROLLOUT_ENTROPY):
            extra_fields, masks, padding = _read_rows(batch)
            rows = rollout_entropy_rows(batch.keys, extra_fields, masks, padding)
            put_rollout_entropy(batch, rows)
            built = entropy_metrics(rows, masks, padding)
            metrics.update({TRAINING_PREFIX + key: value for key, value in built.items()})
        # 2. agreement with the actor's entropy of the same tokens (absent in bypass mode: no actor pass)
        with SECONDS.timed(TRAINER_HOOKS):
            if ACTOR_ENTROPY_KEY in (batch.fields or ()) and agreement_is_defined(
                self.config.actor_rollout_ref.rollout
            ):
                # with carry-over, rows with tokens of earlier weights are left out: the actor has the current ones
                weights = self.global_steps - 1 if _FEATURES.carry_over else None
                metrics.update(_agreement(batch, rows, masks, weights))
            # 3. managed sessions: rows and branches per session, the agents' rewards, turns and tool calls
            metrics.update(managed_metrics(extra_fields, padding))
            # 4. the sampled support (entropy mode "support"): sizes, kept mass, the actor-over-behaviour ratio
            if entropy_config(self.config.actor_rollout_ref.rollout).mode == "support":
                metrics.update(_support(batch, extra_fields, masks, padding))
        return batch

    return _compute_old_log_prob


def _support(
    batch: Any, extra_fields: list[dict | None], masks: list[torch.Tensor], padding: list[bool]
) -> dict[str, float]:
    """:func:`support_metrics` of the real rows (absent in bypass mode: no actor pass, no ``old_log_probs``)."""
    import transfer_queue as tq

    fields = ["old_log_probs", "rollout_log_probs"]
    if not set(fields) <= set(batch.fields or ()):
        return {}
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    real = [i for i, pad in enumerate(padding) if not pad]
    old, rollout = _rows(data["old_log_probs"]), _rows(data["rollout_log_probs"])
    return support_metrics(
        [(extra_fields[i] or {}).get(RESPONSE_SUPPORT_KEY) for i in real],
        [masks[i] for i in real],
        [old[i] for i in real],
        [rollout[i] for i in real],
    )


def _agreement(
    batch: Any, rows: list[dict[str, torch.Tensor]], masks: list[torch.Tensor], weights: int | None = None
) -> dict[str, float]:
    """The agreement metrics over the rows with rollout entropy; with ``weights`` (a weight version), only over the
    rows whose every token was sampled with those weights (``token_global_steps``, carry-over's resuming client)."""
    import transfer_queue as tq

    fields = [ACTOR_ENTROPY_KEY] + (["extra_fields"] if weights is not None else [])
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    counted = torch.stack([row[HAS_ROLLOUT_ENTROPY_KEY] for row in rows])
    if weights is not None:
        versions = [extra.get(TOKEN_GLOBAL_STEPS_KEY, []) for extra in data.pop("extra_fields").tolist()]
        counted &= torch.tensor([all(version == weights for version in row) for row in versions])
    return actor_agreement_metrics(
        _padded([row[ROLLOUT_ENTROPY_KEY] for row in rows]),
        _padded(_rows(data[ACTOR_ENTROPY_KEY])),
        _padded(masks),
        counted,
    )


def _wrap_compute_advantage(original):
    def _compute_advantage(self, batch, metrics):
        batch = original(self, batch, metrics)
        # 1. steering: advantages reshaped from rollout_entropy (no extra forward pass)
        if _FEATURES.steering.active:
            with SECONDS.timed(STEERING):
                metrics.update(_steer(batch))
        return batch

    return _compute_advantage


def _steer(batch: Any) -> dict[str, float]:
    """:func:`steer_advantages` over the real rows of ``batch`` (padded ``[B, R]`` views of its TransferQueue
    fields), the advantages written back per row as verl writes them; the step's metrics."""
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    fields = ["response_mask", "advantages", ROLLOUT_ENTROPY_KEY, HAS_ROLLOUT_ENTROPY_KEY]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    response_mask = data["response_mask"]
    padded = data.to_padded_tensor()
    real = torch.tensor([not tag.get(PADDING_TAG, False) for tag in batch.tags])
    view = SimpleNamespace(batch={field: padded[field][real] for field in fields})
    metrics = steer_advantages(view, _FEATURES.steering)
    advantages = padded["advantages"].clone()
    advantages[real] = view.batch["advantages"]
    written = TensorDict({"advantages": response_to_nested(advantages, response_mask)}, batch_size=len(batch))
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=written)
    return metrics


class _ValidationTap:
    """Stands in for the trainer's replay buffer during ``_validate``: keeps the built entropy rows of every
    validation batch it samples (verl clears them from TransferQueue before ``_validate`` returns)."""

    def __init__(self, replay_buffer: Any) -> None:
        self._replay_buffer = replay_buffer
        self.rows: list[dict[str, torch.Tensor]] = []
        self.masks: list[torch.Tensor] = []

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        batch, sample_metrics = self._replay_buffer.sample(*args, **kwargs)
        with SECONDS.timed(TRAINER_HOOKS):
            rows, masks = read_rollout_entropy(batch)
            self.rows += rows
            self.masks += masks
        return batch, sample_metrics

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._replay_buffer, name)


@contextlib.contextmanager
def _tapped_replay_buffer(trainer: Any) -> Iterator[_ValidationTap]:
    tap = _ValidationTap(trainer.replay_buffer)
    with swapped(trainer, "replay_buffer", tap):
        yield tap


def _wrap_validate(original):
    def _validate(self):
        with _tapped_replay_buffer(self) as tap:
            val_metrics = original(self)
        # 1. rollout entropy of the validation rows
        if tap.rows:
            with SECONDS.timed(TRAINER_HOOKS):
                metrics = entropy_metrics(tap.rows, tap.masks)
                val_metrics.update(
                    {VALIDATION_PREFIX + key.removeprefix("agent_loop/"): v for key, v in metrics.items()}
                )
        return val_metrics

    return _validate


def _wrap_compute_metrics(original):
    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        result = original(self, batch, metrics, timing_raw, global_steps, epoch)
        # 1. over-sampling (failed rows aborted): the reward with and without the aborted rows, which never reached
        #    verl's batch (the replay buffer counted them); verl's critic/score/mean is the kept rows' mean
        rows = getattr(self.replay_buffer, "last_rows", None)
        if _FEATURES.aborts_rows and rows is not None:
            with SECONDS.timed(OVER_SAMPLING):
                metrics.update(score_metrics(metrics.get("critic/score/mean"), *rows))
                if _FEATURES.carry_over:  # the tokens generated, carried and discarded (the servers' ledger)
                    metrics.update(self.replay_buffer.take_carry_metrics())
            self.replay_buffer.last_rows = None
        # 2. every feature's cost since the last step's (timing.py)
        metrics.update(step_metrics(SECONDS.take(), timing_raw.get("step")))
        return result

    return _compute_metrics


def forecast_metrics_named_back(metrics: dict[str, Any]) -> None:
    """The forecast's and the controller's metrics under their own names (``probe/*``, ``control/*``,
    ``timing_s/probe``; the pinned stack's): verl's ``_update_actor`` prefixes every actor metric ``actor/``
    (``rename_dict``), in place."""
    own = tuple(ACTOR_PREFIX + prefix for prefix in (FORECAST_PREFIX, CONTROL_PREFIX))
    for key in [k for k in metrics if k.startswith(own) or k == ACTOR_PREFIX + PROBE_TIMING]:
        metrics[key.removeprefix(ACTOR_PREFIX)] = metrics.pop(key)


def response_tokens(batch: Any) -> int:
    """The response tokens of the step's rows (``KVBatchMeta``: the tags verl's worker put, its padding rows left
    out)."""
    return sum(int(tag[RESPONSE_LEN_TAG]) for tag in batch.tags if not tag.get(PADDING_TAG, False))


def trained_uids(batch: Any) -> set[str]:
    """The uids of the step's rows (``KVBatchMeta``: keys ``<uid>_<session>``, verl's padding rows left out)."""
    return {
        key.split("_")[0] for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get(PADDING_TAG, False)
    }


def _wrap_update_actor(original):
    def _update_actor(self, batch, metrics):
        # 1. forecast, before: the rollout's E of this step (None: no forecast) where the actor seam reads it
        rollout_eval = getattr(self.agent_loop_manager, "rollout_eval", None)
        if rollout_eval is not None:
            with SECONDS.timed(TRAINER_HOOKS):
                E, eval_metrics = take_rollout_eval(rollout_eval, response_tokens(batch), trained_uids(batch))
                batch.extra_info[FORECAST_EVAL_META_KEY] = E
                metrics.update(eval_metrics)
        result = original(self, batch, metrics)
        # 1. forecast, after: its metrics named back (the engine worker's actor seam, actor_seams.py, added them)
        forecast_metrics_named_back(metrics)
        return result

    return _update_actor


def _wrap_prepare_step(original):
    def prepare_step(self):
        carried = self.replay_buffer.carried if _FEATURES.carry_over else 0
        if not carried:
            return original(self)
        # 1. carry-over: the carried groups take slots of this step's batch; only the others are fresh prompts
        fresh = self.config.data.train_batch_size - carried
        if fresh > 0:
            self._add_prompts_to_generate(fresh)
        return {}

    return prepare_step


def _set_weight_version(trainer: Any) -> None:
    """Tell the policy's servers which step's weights they serve (verl's ``set_global_steps``; verl's sglang path
    never calls it): each sampled token's weight version (``resuming_client.py``)."""
    import ray

    handles = trainer.llm_server_manager.server_handles
    ray.get([server.set_global_steps.remote(trainer.global_steps) for server in handles])


def _enable_token_ledger(trainer: Any) -> None:
    """The policy's servers count the tokens of training sessions from now on (``rollout/token_ledger.py``)."""
    import ray

    ray.get([server.enable_token_ledger.remote() for server in trainer.llm_server_manager.server_handles])


def _wrap_on_init_end(original):
    def on_init_end(self):
        original(self)
        # 1. carry-over: the weight version the first step's tokens are sampled with; the servers count the tokens
        #    of training sessions (rollout/token_ledger.py: what a step generates and carries)
        if _FEATURES.carry_over:
            _set_weight_version(self)
            _enable_token_ledger(self)

    return on_init_end


def _wrap_on_sample_end(original):
    def on_sample_end(self):
        # 1. carry-over, before verl sleeps the servers (which needs them idle): pause them, as verl's colocate_async
        #    trainer does; the carried groups' running turns come back "abort" and their client re-sends them after
        #    the resume
        if _FEATURES.carry_over:
            with SECONDS.timed(OVER_SAMPLING):
                self.checkpoint_manager.abort_replicas()
                # 2. carry-over's token counts, now that the carried turns' partial tokens are back
                self.replay_buffer.finish_carry_metrics()
        return original(self)

    return on_sample_end


def _wrap_on_step_end(original):
    def on_step_end(self):
        original(self)  # verl's weight update
        # 1. carry-over: the new weight version, then the paused turns go on (before validation, which needs them)
        if _FEATURES.carry_over:
            with SECONDS.timed(OVER_SAMPLING):
                _set_weight_version(self)
                self.checkpoint_manager.resume_generation_replicas()

    return on_step_end


# verl 0.9.1 keeps in-flight prompt groups across a checkpoint in its async trainer modes only (``trainer_mode !=
# "sync"`` in ``_submit_batch_to_rollout``: each prompt's data persisted in TransferQueue; ``_save_checkpoint`` /
# ``_load_checkpoint``: TransferQueue saved and restored; ``_reissue_inflight_prompts``: pending and running groups
# restarted from their prompt data when ``fit`` starts). With carry-over a sync step leaves groups in flight too, so
# those four run verl's async branch: the mode they see for the call.
_ASYNC_BRANCH_MODE = "colocate_async"


def _wrap_in_async_branch(original):
    def method(self, *args, **kwargs):
        # 1. carry-over: verl's async branch keeps the carried groups across a checkpoint (above)
        if not _FEATURES.carry_over:
            return original(self, *args, **kwargs)
        with swapped(self, "trainer_mode", _ASYNC_BRANCH_MODE):
            return original(self, *args, **kwargs)

    return method


def _wrap_load_checkpoint(original):
    in_async_branch = _wrap_in_async_branch(original)

    def _load_checkpoint(self):
        # 1. carry-over: verl's async branch restores TransferQueue (above); the restored groups, finished ones and
        #    the in-flight ones fit re-issues, take slots of the next step's batch
        result = in_async_branch(self)
        if _FEATURES.carry_over:
            self.replay_buffer.carried = self._restored_tq_prompt_count
        return result

    return _load_checkpoint


# The run's features, from the trainer's config (install); a process trains one run.
_FEATURES = RunFeatures()


def install(features: RunFeatures) -> None:
    """Install the V1 trainer's seams in this process (idempotent) and run them with ``features`` (the latest call's).

    Raises:
        UnsupportedVerlError: another verl version, or a changed signature of a wrapped method.
    """
    from verl.trainer.ppo.v1 import trainer_base, trainer_sync

    global _FEATURES
    VERL_CURRENT.require("V1 trainer hooks")
    trainer = trainer_base.PPOTrainer
    sync = trainer_sync.PPOTrainerSync
    VERL_CURRENT.wrap(
        Wrap(trainer, "prepare_step", _wrap_prepare_step, _SELF),
        Wrap(trainer, "_compute_old_log_prob", _wrap_compute_old_log_prob, _COMPUTE_OLD_LOG_PROB_PARAMS),
        Wrap(trainer, "_compute_advantage", _wrap_compute_advantage, _COMPUTE_ADVANTAGE_PARAMS),
        Wrap(trainer, "_validate", _wrap_validate, _SELF),
        Wrap(trainer, "_compute_metrics", _wrap_compute_metrics, _COMPUTE_METRICS_PARAMS),
        Wrap(trainer, "_update_actor", _wrap_update_actor, _UPDATE_ACTOR_PARAMS),
        Wrap(trainer, "_submit_batch_to_rollout", _wrap_in_async_branch, _SUBMIT_BATCH_PARAMS),
        Wrap(trainer, "_save_checkpoint", _wrap_in_async_branch, _SELF),
        Wrap(trainer, "_load_checkpoint", _wrap_load_checkpoint, _SELF),
        Wrap(trainer, "_reissue_inflight_prompts", _wrap_in_async_branch, _REISSUE_PARAMS),
        Wrap(sync, "on_init_end", _wrap_on_init_end, _SELF),
        Wrap(sync, "on_sample_end", _wrap_on_sample_end, _SELF),
        Wrap(sync, "on_step_end", _wrap_on_step_end, _SELF),
    )
    _FEATURES = features
