# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Which treetune features a run's config turns on, and the start-up refusals of how they combine.

Features and the keys that turn them on (any subset, the blocks in any order on one command line):

- rollout entropy: ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` = our manager (``+treetune=
  rollout_entropy``); the prerequisite of the next three, which its manager and worker carry out;
- over-sampling with abort: ``actor_rollout_ref.rollout.over_sample_rate`` > 0, and/or failed rows aborted
  (``actor_rollout_ref.rollout.custom.over_sample.abort_failed_rows=true``: a trajectory whose agent loop raises
  becomes an aborted row and its group is dropped, instead of failing the step); with
  ``custom.over_sample.carry_over=true`` the aborted groups are resumed at the next step (``max_staleness``: steps a
  token may wait), trained with verl's rollout correction;
- entropy steering: ``actor_rollout_ref.rollout.custom.entropy.{pg_token_quantile, advantage_shaping.alpha}``;
- managed agent sessions: the loop ``entropy_managed_agent`` (a dataset or ``agent.default_agent_loop``); a session
  may train several rows (``actor_rollout_ref.rollout.custom.managed.rows_per_session``, not yet with
  over-sampling);
- the live entropy forecast: ``actor_rollout_ref.rollout.custom.entropy_forecast`` (``+treetune_forecast=
  entropy_forecast``).

Over-sampling and the forecast also need our actor entry point in ``actor_rollout_ref.model.external_lib``
(:data:`PROCESS_SETUP_MODULE`, which both blocks name). No pair of features
conflicts but one, for now (managed sessions of several rows with over-sampling); what is refused is a feature
without its prerequisite, or with a verl setting it does not cover, and the message names both keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from treetune_verl.control.settings import ControlSettings, control_settings
from treetune_verl.forecast.settings import SECTION as FORECAST_SECTION
from treetune_verl.forecast.settings import ForecastSettings, forecast_settings
from treetune_verl.ppo.advantage import (
    ESTIMATORS_WITH_ABORTED_GROUPS,
    ESTIMATORS_WITH_PADDING_ROWS,
    LOSS_AGG_MODES_WITH_PADDING_ROWS,
    exact_entries,
)
from treetune_verl.ppo.entropy_advantage import EntropySteering, entropy_steering
from treetune_verl.rollout.rollout_config import ROWS_PER_SESSION_KEY, rows_per_session
from treetune_verl.trainer.custom_keys import OVER_SAMPLE_KEYS, OVER_SAMPLE_SECTION, check_custom_keys

ROLLOUT = "actor_rollout_ref.rollout"
MANAGER_KEY = f"{ROLLOUT}.agent.agent_loop_manager_class"
MANAGER_CLASS = "treetune_verl.verl.EntropyAgentLoopManager"
RATE_KEY = "over_sample_rate"  # verl's own key under actor_rollout_ref.rollout
# The over_sample section's keys, full paths: one list of them (custom_keys.py, whose typo check knows them too)
FAILED_ROWS_KEY, CARRY_OVER_KEY, MAX_STALENESS_KEY = (
    f"{ROLLOUT}.custom.{OVER_SAMPLE_SECTION}.{key}" for key in OVER_SAMPLE_KEYS
)
DEFAULT_MAX_STALENESS = 2  # steps: a token sampled at step k trains at step k + 2 at the latest
ROLLOUT_CORRECTION_KEY = "algorithm.rollout_correction"
EXTERNAL_LIB_KEY = "actor_rollout_ref.model.external_lib"
PROCESS_SETUP_MODULE = "treetune_verl.verl.process_setup"
WORKER_IMPL_KEY = "trainer.use_legacy_worker_impl"
ESTIMATOR_KEY = "algorithm.adv_estimator"
STEERING_KEY = f"{ROLLOUT}.custom.entropy.pg_token_quantile / advantage_shaping.alpha"


def over_sample_rate(rollout_config: Any) -> float:
    """``rollout.over_sample_rate`` as a float in ``[0, 1)``; raises naming the key otherwise."""
    rate = rollout_config.get(RATE_KEY, 0.0)
    rate = 0.0 if rate is None else float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{ROLLOUT}.{RATE_KEY} must be in [0, 1); got {rate}")
    return rate


def completion_target(rate: float, groups: int) -> int:
    """``ceil((1 - rate) * groups)``: how many whole groups of a step must complete before the rest are aborted.

    Computed on the rate's decimal value so that e.g. ``(1 - 0.1) * 10`` gives 9, not 10. At least 1.
    """
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    keep = round((1.0 - rate) * groups, 9)
    return max(1, min(groups, math.ceil(keep)))


def external_libs(config: Any) -> list[str]:
    """``actor_rollout_ref.model.external_lib`` as a list (verl takes one module name; a list is read too)."""
    libs = OmegaConf.select(config, EXTERNAL_LIB_KEY, default=None)
    return [] if libs is None else [libs] if isinstance(libs, str) else list(libs)


def has_process_setup(config: Any) -> bool:
    return PROCESS_SETUP_MODULE in external_libs(config)


def _flag(config: Any, key: str) -> bool:
    """A boolean key (default ``False``); raises naming the key unless a bool."""
    value = OmegaConf.select(config, key, default=False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false; got {value!r}")
    return value


def abort_failed_rows(config: Any) -> bool:
    """``rollout.custom.over_sample.abort_failed_rows`` (default ``False``)."""
    return _flag(config, FAILED_ROWS_KEY)


def max_staleness(config: Any) -> int:
    """``rollout.custom.over_sample.max_staleness``: an int >= 1 (default :data:`DEFAULT_MAX_STALENESS`)."""
    value = OmegaConf.select(config, MAX_STALENESS_KEY, default=None)
    if value is None:
        return DEFAULT_MAX_STALENESS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{MAX_STALENESS_KEY} must be an integer >= 1 (steps); got {value!r}")
    return value


@dataclass(frozen=True)
class RunFeatures:
    """The features one run's config turns on (module docstring)."""

    rollout_entropy: bool = False
    over_sample_rate: float = 0.0
    abort_failed_rows: bool = False
    carry_over: bool = False
    max_staleness: int = DEFAULT_MAX_STALENESS
    steering: EntropySteering = EntropySteering()
    forecast: ForecastSettings | None = None
    rows_per_session: int = 1
    control: ControlSettings | None = None

    @classmethod
    def from_config(cls, config: Any, rollout_entropy: bool | None = None) -> RunFeatures:
        """Read (and check each feature's own keys) from verl's whole trainer config.

        ``rollout_entropy``: whether our manager runs (our manager says ``True``; ``None``: whether the config names
        it).

        Raises:
            ValueError: a feature's key out of range, or an unknown key in one of our ``rollout.custom`` sections
                (``custom_keys.py``), naming it.
        """
        rollout = OmegaConf.select(config, ROLLOUT, default=None) or {}
        check_custom_keys(rollout)
        if rollout_entropy is None:
            rollout_entropy = OmegaConf.select(config, MANAGER_KEY, default=None) == MANAGER_CLASS
        return cls(
            rollout_entropy=rollout_entropy,
            over_sample_rate=over_sample_rate(rollout),
            abort_failed_rows=abort_failed_rows(config),
            carry_over=_flag(config, CARRY_OVER_KEY),
            max_staleness=max_staleness(config),
            steering=entropy_steering(rollout),
            forecast=forecast_settings(rollout),
            rows_per_session=rows_per_session(rollout),
            control=control_settings(rollout),  # refuses the section without the forecast's
        )

    @property
    def aborts_rows(self) -> bool:
        """Whether training steps run through the group counter and may abort rows (over-sampling, failed rows)."""
        return self.over_sample_rate > 0 or self.abort_failed_rows

    @property
    def enabled(self) -> list[str]:
        """Names of the features on, in the order the seams run them."""
        named = {
            "rollout_entropy": self.rollout_entropy,
            "over_sampling": self.aborts_rows,
            "steering": self.steering.active,
            "forecast": self.forecast is not None,
            "control": self.control is not None,
        }
        return [name for name, on in named.items() if on]


def check_features(config: Any, rollout_entropy: bool | None = None) -> RunFeatures:
    """Refuse, before anything starts, features without their prerequisite or with verl settings they do not cover;
    the features on (``rollout_entropy`` as in :meth:`RunFeatures.from_config`).

    Raises:
        ValueError: naming both keys of each refused combination.
    """
    features = RunFeatures.from_config(config, rollout_entropy)
    needs_manager = {
        f"{ROLLOUT}.{RATE_KEY} > 0": features.over_sample_rate > 0,
        FAILED_ROWS_KEY: features.abort_failed_rows,
        CARRY_OVER_KEY: features.carry_over,
        STEERING_KEY: features.steering.active,
    }
    for key, on in needs_manager.items():
        if on and not features.rollout_entropy:
            raise ValueError(
                f"{key} needs rollout entropy ({MANAGER_KEY}={MANAGER_CLASS}, the +treetune=rollout_entropy block): "
                "without it nothing reads the key"
            )
    if features.aborts_rows:
        check_over_sample_config(config)
        check_session_rows_not_aborted(config, features)
    if features.carry_over:
        check_carry_over_config(config, features)
    if features.forecast is not None:
        if not has_process_setup(config):
            raise ValueError(
                f"{FORECAST_SECTION} needs {EXTERNAL_LIB_KEY}={PROCESS_SETUP_MODULE} (the forecast's block sets it)"
            )
        if OmegaConf.select(config, WORKER_IMPL_KEY, default="auto") == "disable":
            raise ValueError(
                f"{FORECAST_SECTION} supports verl's legacy FSDP workers only: not {WORKER_IMPL_KEY}=disable"
            )
    return features


def check_session_rows_not_aborted(config: Any, features: RunFeatures) -> None:
    """Refuse managed sessions of several rows with over-sampling or failed rows aborted (either stack).

    Raises:
        ValueError: naming both keys.
    """
    if features.aborts_rows and features.rows_per_session > 1:
        raise ValueError(
            f"{ROWS_PER_SESSION_KEY}={features.rows_per_session} with {_aborting_key(config)}: over-sampling "
            "counts and aborts one trajectory per row, not yet a session's rows"
        )


def check_over_sample_config(config: Any) -> None:
    """Refuse settings under which aborted rows would be trained on wrongly.

    Raises:
        ValueError: an estimator that is not exact with aborted groups (the table
            :data:`~treetune_verl.ppo.advantage.ESTIMATORS_WITH_ABORTED_GROUPS`, with the reason, or one it does not
            know) or a critic; the actor's loss fix not loaded (``external_lib``); verl's new worker implementation or
            routing replay, which the fixes do not cover.
    """
    what = _aborting_key(config)
    unknown = "not checked with aborted rows (score 0, empty response)"
    _require_exact(what, ESTIMATOR_KEY, _estimator(config), ESTIMATORS_WITH_ABORTED_GROUPS, unknown)
    if _critic_on(config):
        raise ValueError(f"{what} with critic.enable=True: the critic's value loss would fit the aborted rows")
    if not has_process_setup(config):
        raise ValueError(
            f"{what} needs the actor to leave aborted rows out (in verl 0.7.1 a micro-batch of aborted rows "
            f"stops the actor's rollout-correction metrics and dilutes its loss): set {EXTERNAL_LIB_KEY}="
            f"{PROCESS_SETUP_MODULE}"
        )
    if OmegaConf.select(config, WORKER_IMPL_KEY, default="auto") == "disable":
        raise ValueError(f"{what} supports verl's legacy FSDP workers only ({WORKER_IMPL_KEY})")
    if OmegaConf.select(config, f"{ROLLOUT}.enable_rollout_routing_replay", default=False):
        raise ValueError(f"{what} does not support {ROLLOUT}.enable_rollout_routing_replay")


def check_carry_over_config(config: Any, features: RunFeatures) -> None:
    """Refuse carry-over where it has nothing to carry, or where its resumed tokens would train unweighted.

    Raises:
        ValueError: no over-sampling; verl's rollout correction off (``rollout_is`` unset and no bypass mode): the
            tokens of earlier steps were sampled by older weights, and only the correction weighs them.
    """
    if features.over_sample_rate <= 0:
        raise ValueError(f"{CARRY_OVER_KEY}=true needs over-sampling ({ROLLOUT}.{RATE_KEY} > 0): nothing is aborted")
    correction = OmegaConf.select(config, ROLLOUT_CORRECTION_KEY, default=None) or {}
    if correction.get("rollout_is") not in ("token", "sequence") and not correction.get("bypass_mode", False):
        raise ValueError(
            f"{CARRY_OVER_KEY}=true trains tokens sampled by earlier weights: set verl's rollout correction, e.g. "
            f"{ROLLOUT_CORRECTION_KEY}.rollout_is=token (or {ROLLOUT_CORRECTION_KEY}.bypass_mode=true)"
        )


# verl 0.9.1 (the current stack): what runs there so far, and how the rest is refused.
USE_V1_KEY = "trainer.use_v1"
TRAINER_MODE_KEY = "trainer.v1.trainer_mode"
CURRENT_TRAINER_MODES = ("sync", "colocate_async")  # separate_async overrides _compute_old_log_prob
# Over-sampling's V1 replay buffer (verl/v0_9_1/over_sample_sampler.py), selected through verl's own keys.
SAMPLER_KEY = "trainer.v1.sampler.custom_sampler"
SAMPLER_PATH = "pkg://treetune_verl.verl.v0_9_1.over_sample_sampler"
SAMPLER_NAME = "OverSampleReplayBuffer"
GEN_BATCH_SIZE_KEY = "data.gen_batch_size"
SYNC_PARTS_KEY = "trainer.v1.sync.parameter_sync_step"  # verl reads it per trainer mode (trainer_base.py:130)


def check_current_stack(config: Any, verl_version: str) -> RunFeatures:
    """Refuse, at start-up, what treetune-verl does not run on verl 0.9.1 yet; the features on.

    Rollout entropy and entropy steering (forking tokens, advantage shaping: trainer-side only) run on verl 0.9.1's
    default (V1) trainer in its ``sync`` and ``colocate_async`` modes, over-sampling in ``sync`` with its replay
    buffer (:func:`check_current_over_sample_config`), managed agent sessions in ``sync`` and ``colocate_async`` (of
    several rows each: not with over-sampling), the live forecast in the engine worker's actor
    (``verl/v0_9_1/actor_seams.py``; E sampled there: the V1 rollout does not sample E yet).

    Raises:
        ValueError: naming the refused key and ``verl_version``.
    """
    features = RunFeatures.from_config(config, rollout_entropy=True)
    if not OmegaConf.select(config, USE_V1_KEY, default=True):
        raise ValueError(
            f"rollout entropy on verl {verl_version} runs in its default trainer: not {USE_V1_KEY}=false (verl's "
            "deprecated RayPPOTrainer)"
        )
    mode = OmegaConf.select(config, TRAINER_MODE_KEY, default="sync")
    if mode not in CURRENT_TRAINER_MODES:
        raise ValueError(
            f"rollout entropy on verl {verl_version} supports {TRAINER_MODE_KEY} in {CURRENT_TRAINER_MODES}; got "
            f"{mode!r}"
        )
    if features.aborts_rows:
        check_current_over_sample_config(config, verl_version)
        check_session_rows_not_aborted(config, features)
    if features.carry_over:
        check_carry_over_config(config, features)
        gen_batch_size = OmegaConf.select(config, GEN_BATCH_SIZE_KEY, default=None)
        if gen_batch_size != 1:
            raise ValueError(
                f"{CARRY_OVER_KEY}=true on verl {verl_version} dispatches train_batch_size - carried groups of fresh "
                f"prompts each step, which verl fetches in whole data.gen_batch_size chunks: set "
                f"{GEN_BATCH_SIZE_KEY}=1 (got {gen_batch_size})"
            )
    return features


def check_current_over_sample_config(config: Any, verl_version: str) -> None:
    """Refuse over-sampling or failed rows aborted on verl 0.9.1 without the replay buffer, in another trainer mode, or
    with settings that verl's padding of the smaller batch would make wrong.

    Raises:
        ValueError: naming the key (the replay buffer's two keys and values; the trainer mode; the estimator or loss
            mode, with the reason and the supported ones).
    """
    what = f"over-sampling ({_aborting_key(config)}) on verl {verl_version}"
    sampler = {key: OmegaConf.select(config, f"{SAMPLER_KEY}.{key}", default=None) for key in ("path", "name")}
    if sampler != {"path": SAMPLER_PATH, "name": SAMPLER_NAME}:
        raise ValueError(
            f"{what} runs in its replay buffer: set {SAMPLER_KEY}.path={SAMPLER_PATH} and {SAMPLER_KEY}.name="
            f"{SAMPLER_NAME} (got {sampler})"
        )
    mode = OmegaConf.select(config, TRAINER_MODE_KEY, default="sync")
    if mode != "sync":
        raise ValueError(
            f"{what} needs {TRAINER_MODE_KEY}=sync (an async trainer keeps groups across steps); got {mode!r}"
        )
    # verl samples a step in parameter_sync_step parts from one dispatch; the buffer aborts whatever the first part
    # leaves, so the next part would wait for groups that are gone
    sync_parts = OmegaConf.select(config, SYNC_PARTS_KEY, default=1)
    if sync_parts not in (None, 1):
        raise ValueError(f"{what} samples each step in one part: not {SYNC_PARTS_KEY}={sync_parts}")
    # verl hands a custom replay buffer neither DAPO's group filter nor the refill of failed groups
    # (trainer_base.py _build_replay_buffer): with ours they would be off without a word
    for key in ("algorithm.filter_groups.enable", "trainer.v1.sampler.sync_refill_failed_groups"):
        if OmegaConf.select(config, key, default=False):
            raise ValueError(f"{what} does not run {key}=true: verl does not pass it to a custom replay buffer")
    # The batch of kept groups is smaller than train_batch_size, and verl pads it with rows of its own: only what is
    # exact with them is run (ppo/advantage.py, measured in ppo/test_padding_rows_v0_9_1_on_cpu.py). Refused even
    # where a config's sizes would need no padding: dp size, mini-batch and target are not all known here.
    unknown = "not checked with verl's padding rows"
    _require_exact(what, ESTIMATOR_KEY, _estimator(config), ESTIMATORS_WITH_PADDING_ROWS, unknown)
    loss_keys = ["actor_rollout_ref.actor.loss_agg_mode"] + (["critic.loss_agg_mode"] if _critic_on(config) else [])
    for key in loss_keys:
        loss_mode = OmegaConf.select(config, key, default="token-mean")
        _require_exact(what, key, loss_mode, LOSS_AGG_MODES_WITH_PADDING_ROWS, unknown)


def _aborting_key(config: Any) -> str:
    """The key that makes a run's rows abort: the over-sampling rate, else failed rows aborted."""
    rate = over_sample_rate(OmegaConf.select(config, ROLLOUT, default=None) or {})
    return f"{ROLLOUT}.{RATE_KEY} > 0" if rate > 0 else f"{FAILED_ROWS_KEY}=true"


def _require_exact(what: str, key: str, value: str, table: dict[str, str | None], unknown: str) -> None:
    """Refuse ``key=value`` unless ``table`` marks it exact: with the table's reason, or ``unknown`` when it is not
    in the table, and the exact entries."""
    reason = table.get(value, unknown)
    if reason is not None:
        raise ValueError(f"{what} with {key}={value}: {reason}. Use one of: {', '.join(exact_entries(table))}.")


def _estimator(config: Any) -> str:
    estimator = OmegaConf.select(config, ESTIMATOR_KEY, default="") or ""
    return str(getattr(estimator, "value", estimator))


def _critic_on(config: Any) -> bool:
    return bool(OmegaConf.select(config, "critic.enable", default=None))
