# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling with carry-over: the groups a step aborts are resumed at the next step instead of thrown away.

With over-sampling (``over_sample.py``) a step keeps the first whole groups to complete and aborts the others. With
``actor_rollout_ref.rollout.custom.over_sample.carry_over=true`` an aborted group keeps what its rows generated
(:class:`CarriedRow`: the tokens, each token's behaviour log-prob and entropy, and the training step whose weights
sampled it) and takes a slot of the next step's batch, where each row is resumed: a finished row as it is, a cut row
as a continuation of its prompt and partial tokens with the remaining budget (``continuation_agent_loop.py``). A
trained row's ``rollout_log_probs`` are each token's own behaviour log-prob, which verl's rollout correction
(``algorithm.rollout_correction``) weighs. A row whose oldest token is more than ``max_staleness`` steps old when it
would resume starts afresh instead (its tokens are discarded).

Batch size and groups stay what verl expects: at step ``t`` the batch holds the carried groups (oldest first), then
the prompts waiting in the backlog, then the dataloader's; the prompts displaced wait in the backlog, in order, so
no prompt is lost (they are trained later). Only single-turn rows from loops that report their stop reason
(``entropy_single_turn_agent``) resume; any other row of a carried group restarts.

The backlog is bounded: verl's ``fit`` would draw a whole batch every step while a step takes only ``slots -
carried`` fresh prompts, so the backlog would grow by the carried groups at every step of an epoch (issue 49: 0, 1,
2, 3 over 4 steps). :class:`BoundedLoader` (installed over ``trainer.train_dataloader`` by the trainer's ``fit``
seam) draws the dataloader only when the backlog cannot fill the step (:meth:`CarryOver.needs_prompts`) and hands
``fit`` an empty batch otherwise, so the step's prompts come from the backlog alone. The backlog then stays under one
batch and a prompt waits at most :func:`prompt_wait_bound` steps (logged with the longest wait of the step's prompts).
Every drawn prompt is trained once, in the order drawn; an epoch takes more steps than the dataloader's batches (about
``slots / (slots - carried)`` times as many), and the prompts still waiting when an epoch's batches run out go first
in the next epoch.

Who calls what, all in the trainer's process:

- the trainer's ``_get_gen_batch`` seam (``treetune_verl/verl/v0_7_1/trainer_seams.py``): :meth:`CarryOver.fill_slots`;
  its checkpoint seams save and restore :meth:`CarryOver.state_dict` next to verl's dataloader state, so a resumed
  run loses neither the carried groups nor the waiting prompts;
- the manager (``entropy_manager.py``): :meth:`CarryOver.resume_column` before the step's generation (each row's
  :class:`CarriedRow` for the workers, ``carry_over_worker.py``), :meth:`CarryOver.keep_aborted` after it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from verl.protocol import DataProto

from treetune_verl.rollout.token_output import ABORTED_STOP_REASON

METRIC_PREFIX = "rollout/carry_over/"


@dataclass(frozen=True)
class CarriedRow:
    """What one row generated before its group was aborted; lists aligned token for token.

    Attributes:
        prompt_ids: the row's prompt, unpadded.
        response_ids: the response so far.
        log_probs: each token's log-prob under the policy that sampled it (behaviour), nats.
        entropy: each token's sampling-time entropy, nats.
        token_steps: the training step (``global_steps``) whose weights sampled each token.
        finished: the response is complete (stopped, or at its length cap): resumed as it is.
        sampling_params: those of the row's own request (its loop's, ``max_new_tokens`` counted from the prompt): a
            continuation samples as the row would have.
        resumable: the row can be resumed (a loop that reports its stop reason and sampling parameters, log-probs
            and entropy served); otherwise only its length counts (tokens discarded) and the row restarts.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]
    entropy: list[float]
    token_steps: list[int]
    finished: bool
    sampling_params: dict[str, Any] = field(default_factory=dict)
    resumable: bool = True

    def __post_init__(self) -> None:
        if self.resumable:
            lengths = {len(self.response_ids), len(self.log_probs), len(self.entropy), len(self.token_steps)}
            if len(lengths) != 1:
                raise ValueError(
                    f"CarriedRow: {len(self.response_ids)} tokens, {len(self.log_probs)} log-probs, "
                    f"{len(self.entropy)} entropies, {len(self.token_steps)} steps"
                )

    def __len__(self) -> int:
        return len(self.response_ids)

    def staleness(self, step: int) -> int:
        """Steps since the oldest token was sampled (0 for an empty row)."""
        return step - min(self.token_steps) if self.token_steps else 0


def token_budget(sampling_params: dict[str, Any], response_length: int) -> int:
    """The most tokens a row's response may hold: its request's ``max_new_tokens`` (or ``max_tokens``), at most
    ``response_length``."""
    cap = sampling_params.get("max_new_tokens", sampling_params.get("max_tokens"))
    return response_length if cap is None else min(int(cap), response_length)


def carried_row(
    prompt_ids: list[int],
    response_ids: list[int],
    log_probs: list[float] | None,
    entropy: list[float] | None,
    resume: dict[str, Any] | None,
    resumed: CarriedRow | None,
    step: int,
    response_length: int,
) -> CarriedRow:
    """The :class:`CarriedRow` of an aborted row: the tokens it brought in (``resumed``) keep their steps, the ones
    generated at ``step`` get ``step``. ``resume``: the loop's ``{"stop_reason", "sampling_params"}``
    (``batch_keys.RESUME_KEY``); not resumable without it, log-probs or entropy."""
    resume = resume or {}
    stop_reason, sampling_params = resume.get("stop_reason"), resume.get("sampling_params")
    resumable = None not in (stop_reason, sampling_params, log_probs, entropy)
    sampling_params = dict(sampling_params or {})
    prefix = resumed.token_steps if resumed is not None else []
    return CarriedRow(
        prompt_ids=list(prompt_ids),
        response_ids=list(response_ids),
        log_probs=list(log_probs or []),
        entropy=list(entropy or []),
        token_steps=list(prefix) + [step] * (len(response_ids) - len(prefix)),
        finished=stop_reason != ABORTED_STOP_REASON
        or len(response_ids) >= token_budget(sampling_params, response_length),
        sampling_params=sampling_params,
        resumable=resumable,
    )


@dataclass
class _CarriedGroup:
    prompt: DataProto  # the trainer's row of the group's prompt (one row, its uid included)
    rows: list[CarriedRow | None]  # None: the row restarts


class CarryOver:
    """The carried groups and the prompts they displaced, between steps (module docstring).

    Args:
        max_staleness: a row resumes only while its oldest token was sampled at most this many steps ago.
    """

    def __init__(self, max_staleness: int, slots: int, most_carried: int) -> None:
        if max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1 step, got {max_staleness}")
        self.max_staleness = max_staleness
        self.slots = slots  # groups per step: the dataloader's batch size
        self.wait_bound = prompt_wait_bound(slots, most_carried)
        self._groups: dict[str, _CarriedGroup] = {}  # insertion order: oldest first
        self._backlog: list[DataProto] = []  # one-row prompts waiting for a slot, first in first out
        self._drawn: list[int] = []  # the step at which each prompt of the backlog was drawn
        self._prompts: dict[str, DataProto] = {}  # this step's prompt rows by uid
        self._resuming: dict[str, list[CarriedRow | None]] = {}  # this step's resumed groups
        self._metrics: dict[str, float] = {}

    @property
    def carried_groups(self) -> int:
        return len(self._groups)

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def carried(self, uid: str) -> list[CarriedRow | None] | None:
        """The rows group ``uid`` carries into the next step (``None``: not carried)."""
        group = self._groups.get(uid)
        return None if group is None else list(group.rows)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (the trainer's ``_save_checkpoint`` seam): the carried groups and the backlog."""
        return {
            "max_staleness": self.max_staleness,
            "groups": dict(self._groups),
            "backlog": list(self._backlog),
            "drawn": list(self._drawn),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the trainer's ``_load_checkpoint`` seam), keeping this run's bound.

        Raises:
            ValueError: a state without the backlog's draw steps (saved before the backlog was bounded).
        """
        if "drawn" not in state or len(state["drawn"]) != len(state["backlog"]):
            raise ValueError(
                "carry-over: the checkpoint's state has no draw step for each waiting prompt (saved by an earlier "
                "treetune-verl, before the backlog was bounded): resume from a checkpoint of this version"
            )
        self._groups, self._backlog, self._drawn = dict(state["groups"]), list(state["backlog"]), list(state["drawn"])

    def needs_prompts(self) -> bool:
        """Whether the next step needs the dataloader: the backlog holds fewer prompts than the slots the carried
        groups leave free (:class:`BoundedLoader`)."""
        return len(self._backlog) < self.slots - min(len(self._groups), self.slots)

    def empty_batch(self) -> dict[str, Any]:
        """A batch of the dataloader's fields and no row (``fit``'s ``batch_dict``), from a waiting prompt's row.

        Raises:
            RuntimeError: no prompt is waiting (nothing says what the dataloader's fields are).
        """
        if not self._backlog:
            raise RuntimeError("carry-over: an empty batch asked for with no prompt waiting")
        row = self._backlog[0]
        fields: dict[str, Any] = {key: value[:0] for key, value in row.batch.items()}
        fields.update({key: value[:0] for key, value in row.non_tensor_batch.items() if key != "uid"})
        return fields

    def fill_slots(self, batch: DataProto, step: int) -> None:
        """Give the carried groups and the waiting prompts their slots in the trainer's ``batch`` (in place, before
        verl's ``_get_gen_batch`` splits it); the prompts displaced join the backlog.

        Args:
            batch: the dataloader's prompts (one row each, ``uid`` set), as ``fit`` holds them: a whole batch of
                :attr:`slots`, or none when the backlog fills the step (:class:`BoundedLoader`).
            step: the trainer's ``global_steps``.

        Raises:
            ValueError: ``batch`` holds neither :attr:`slots` prompts nor none, or none while the backlog cannot fill
                the step (the dataloader is not the :class:`BoundedLoader`).
        """
        drawn = len(batch)
        if drawn not in (0, self.slots) or (drawn == 0 and self.needs_prompts()):
            raise ValueError(
                f"carry-over: a step's batch of {drawn} prompts with {len(self._backlog)} waiting and "
                f"{len(self._groups)} group(s) carried ({self.slots} slots): the trainer's dataloader must be "
                "carry_over.BoundedLoader (the trainer's fit seam installs it)"
            )
        size = self.slots
        groups = list(self._groups.items())
        carried, later = groups[:size], groups[size:]
        self._groups = dict(later)
        queue = self._backlog + [_row(batch, i) for i in range(drawn)]
        drawn_at = self._drawn + [step] * drawn
        taken = size - len(carried)
        fresh, self._backlog = queue[:taken], queue[taken:]
        waits, self._drawn = [step - at for at in drawn_at[:taken]], drawn_at[taken:]
        self._resuming, stale_rows, stale_tokens = {}, 0, 0
        for uid, group in carried:
            rows = []
            for row in group.rows:
                if row is not None and row.staleness(step) > self.max_staleness:
                    stale_rows, stale_tokens, row = stale_rows + 1, stale_tokens + len(row), None
                rows.append(row)
            self._resuming[uid] = rows
        rows = [group.prompt for _, group in carried] + fresh
        filled = DataProto.concat(rows)  # new arrays: the one-row prompts stay as they are
        batch.batch, batch.non_tensor_batch = filled.batch, filled.non_tensor_batch
        self._prompts = {str(row.non_tensor_batch["uid"][0]): row for row in rows}
        self._metrics = {
            "groups_resumed": len(carried),
            "rows_restarted_stale": stale_rows,
            "tokens_discarded_stale": stale_tokens,
            "backlog": len(self._backlog),
            "prompt_wait_max": max(waits, default=0),
            "prompt_wait_bound": self.wait_bound,
        }

    def resume_column(self, uids: np.ndarray) -> np.ndarray:
        """Object ``[B]``: each row's :class:`CarriedRow` to resume (``None``: a fresh row), for the step's prompts
        (``uids``: their ``uid`` column, ``rollout.n`` rows per group)."""
        column = np.empty(len(uids), dtype=object)
        seen: Counter[str] = Counter()
        for i, uid in enumerate(uids):
            rows = self._resuming.get(str(uid))
            if rows is not None:
                column[i] = rows[seen[str(uid)]] if seen[str(uid)] < len(rows) else None
                seen[str(uid)] += 1
        return column

    def keep_aborted(
        self,
        uids: np.ndarray,
        resumed: np.ndarray,
        records: np.ndarray,
        aborted: np.ndarray,
        failed: np.ndarray,
        trained_tokens: np.ndarray,
        step: int,
    ) -> dict[str, float]:
        """Carry the step's aborted groups into the next; the step's carry-over metrics.

        Args:
            uids: ``[B]`` the rows' groups.
            resumed: ``[B]`` what each row resumed from (:meth:`resume_column`).
            records: ``[B]`` what each aborted row generated (:class:`CarriedRow`; ``None`` for kept rows).
            aborted, failed: ``[B]`` bool, the rows' ``rollout_aborted`` / ``rollout_failed``.
            trained_tokens: ``[B]`` each row's response tokens in the batch (``response_mask`` summed).
            step: the trainer's ``global_steps``.

        A group with a failed row is dropped (its tokens discarded), as without carry-over.
        """
        metrics = dict.fromkeys(
            ("rows_trained", "tokens_trained", "tokens_generated", "tokens_carried", "tokens_discarded"), 0.0
        )
        staleness: Counter[int] = Counter()
        carried: dict[str, list[CarriedRow | None]] = {}
        dropped = {str(uid) for uid, bad in zip(uids, failed, strict=True) if bad}
        for uid, prior, record, cut, tokens in zip(uids, resumed, records, aborted, trained_tokens, strict=True):
            uid, before = str(uid), len(prior) if prior is not None else 0
            if not cut:
                metrics["tokens_generated"] += int(tokens) - before
                if prior is not None and before:
                    metrics["rows_trained"] += 1
                    metrics["tokens_trained"] += before
                    staleness.update(step - s for s in prior.token_steps)
                continue
            length = len(record) if record is not None else 0
            metrics["tokens_generated"] += max(length - before, 0)
            if uid in dropped or record is None or not record.resumable:
                metrics["tokens_discarded"] += length
                record = None
            else:
                metrics["tokens_carried"] += length
            carried.setdefault(uid, []).append(record)
        for uid, rows in carried.items():
            if uid in dropped:
                continue
            if uid not in self._prompts:
                raise RuntimeError(
                    f"carry-over: group {uid!r} has no prompt row: the trainer's _get_gen_batch seam "
                    "(CarryOver.fill_slots) did not run for this step"
                )
            self._groups[uid] = _CarriedGroup(prompt=self._prompts[uid], rows=rows)
        metrics["tokens_discarded"] += self._metrics.get("tokens_discarded_stale", 0)
        metrics.update(self._metrics)
        metrics["groups_carried"] = len(self._groups)
        generated = metrics["tokens_generated"]
        metrics["discarded_share"] = metrics["tokens_discarded"] / generated if generated else 0.0
        metrics.update({f"staleness/{age}": float(count) for age, count in sorted(staleness.items())})
        self._metrics, self._resuming = {}, {}
        return {METRIC_PREFIX + key: float(value) for key, value in metrics.items()}


def prompt_wait_bound(slots: int, most_carried: int) -> int:
    """The most steps a prompt waits between the dataloader's draw and its slot, with :class:`BoundedLoader` and at
    most ``most_carried`` groups carried per step (``slots`` minus over-sampling's target).

    The dataloader is drawn only while the backlog holds fewer than the free slots, so a drawn prompt stands fewer
    than ``2 slots - 1`` places from the queue's head, and every step takes at least ``slots - most_carried`` of them.

    Raises:
        ValueError: ``most_carried`` not in ``[0, slots)`` (a step must take a fresh prompt).
    """
    if not 0 <= most_carried < slots:
        raise ValueError(f"carry-over: {most_carried} carried groups of {slots} slots per step")
    return (2 * slots - 1) // (slots - most_carried)


class BoundedLoader:
    """verl's training dataloader, drawn only when the backlog cannot fill the next step (module docstring).

    ``fit`` iterates it as the dataloader; each item is either the dataloader's next batch or, when
    :meth:`CarryOver.needs_prompts` is false, an empty batch of the same fields (``fit`` turns it into an empty
    ``DataProto``; :meth:`CarryOver.fill_slots` fills the step from the backlog). ``state_dict`` /
    ``load_state_dict``, ``len`` and every other attribute are the dataloader's (verl saves and restores its position;
    nothing drawn is held here: a drawn batch goes to ``fit`` at once, its prompts to the backlog, which carry-over's
    checkpoint keeps).
    """

    def __init__(self, loader: Any, carry_over: CarryOver) -> None:
        self.loader, self.carry_over = loader, carry_over

    def __iter__(self) -> Iterator[dict[str, Any]]:
        batches = iter(self.loader)
        while True:
            if not self.carry_over.needs_prompts():
                yield self.carry_over.empty_batch()
                continue
            try:
                yield next(batches)
            except StopIteration:
                return  # the epoch's batches are drawn; the prompts waiting go first in the next

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)  # the rest is the dataloader's (``fit`` reads its ``sampler``)


def _row(batch: DataProto, index: int) -> DataProto:
    """Row ``index`` of ``batch`` as a one-row copy, without the batch's ``meta_info``."""
    row = batch.select_idxs([index])
    row.meta_info = {}
    return row
