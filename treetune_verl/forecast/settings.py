# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast's settings: ``actor_rollout_ref.rollout.custom.entropy_forecast``, read and checked in the actor.

``custom`` is verl's free-form extension point of ``RolloutConfig`` (the actor's own config is a closed dataclass);
the actor worker holds the whole ``actor_rollout_ref`` section, so it reads the forecast's keys there. Keys:

    every: int >= 1          forecast every k-th training step's update (1, 1+k, ...; the rollout manager's count of
                             training calls when it samples E, else this worker's ``update_actor`` calls)
    estimators: list         X estimators, a non-empty subset of [naive, rb_residual] (naive needs rollout.n >= 2)
    eval_share: float        the share of the step's distinct prompts in E, in (0, 1] (0.5): the first
                             ⌈share · B⌉ uids in sorted order (verl's uids are random), ``rollout.n`` responses each;
                             the forecast's cost and its standard errors' 1/√size scale with it
    seed: int                seeds E's sampling in the actor (with the step and the rank), the fallback without our
                             rollout manager; sglang's sampling of E is seeded as the rollout's is
    method: str              how ⟨X_b, Δθ⟩ is taken (``directional.py``): ``auto`` (central differences of three
                             forwards when the actor computes in float32, backward passes below it, e.g. bf16 mixed
                             precision), ``central_difference`` (refused below float32) or ``backward``
    probe: dict              a partial probe config (``treetune_verl/probe/config/probe.yaml``: ``estimator.*``,
                             ``probe.buffers_dtype``...), merged over ``PROBE_DEFAULTS`` (the RB baseline ``none``)
                             and validated by the probe's ``resolve_config``
    early_warning: dict      the collapse and disagreement warnings (``early_warning.py``): ``fraction`` (0.5) of
                             the token entropy reached within ``horizon`` (20) training steps at the forecast rate,
                             ``window`` (1) forecasts averaged, the first ``skip`` (1) ignored, ``z`` (2.0),
                             ``consecutive`` (3)
    record_dir: str | None   a folder for one file per forecast with E's per-token values (``record.py``): studies
                             recompute estimators from them; null (default) writes nothing

A section that is absent or null turns the forecast off; anything else wrong raises ``ValueError`` naming the key.
E is sampled by the rollout's sglang servers beside the step's rollout when our manager runs it (``rollout_eval.py``),
else in the actor. Either way it is sampled from, and its entropy is that of, the actor's policy at the rollout's
temperature over the whole vocabulary (top-p = 1), the policy verl's actor computes its log-probabilities and
``actor/entropy`` with: the forecast's directional derivatives (``directional.py``) need it differentiable, which a
nucleus cut is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from treetune_verl.config.job_config import is_int
from treetune_verl.config.keys import check_known_keys, plain
from treetune_verl.forecast.early_warning import WarningSettings, warning_settings
from treetune_verl.probe.config import resolve_config
from treetune_verl.rollout.rollout_config import read_key

SECTION = "actor_rollout_ref.rollout.custom.entropy_forecast"
ESTIMATORS = ("naive", "rb_residual")
METHODS = ("auto", "central_difference", "backward")
# The forecast's defaults over the probe's (``probe/config/probe.yaml``): the Rao-Blackwellised estimator's baseline
# b_j = H_j (``none``), not the probe's running positional mean (``residual_mu``). On a collapsing SmolLM2 run
# (response lengths 47 -> 5 tokens in 10 steps) the running mean lagged the responses it met: rb_residual's standard
# error over E's prompts was 0.28 nats per budget token with it, 0.046 without (treetune_specs/2026-11-28-forecast-
# calibration.md). A ``probe`` setting is merged over these.
PROBE_DEFAULTS = {"estimator": {"baseline": {"mode": "none"}}}
KEYS = ("every", "estimators", "eval_share", "seed", "method", "probe", "early_warning", "record_dir")


@dataclass(frozen=True)
class ForecastSettings:
    every: int = 1
    estimators: tuple[str, ...] = ESTIMATORS
    eval_share: float = 0.5
    seed: int = 0
    method: str = "auto"
    probe: dict[str, Any] = field(default_factory=dict)
    early_warning: WarningSettings = field(default_factory=WarningSettings)
    record_dir: str | None = None

    def eval_uids(self, uids: list[str]) -> list[str]:
        """E's prompts among a step's distinct ``uids``: the first ⌈eval_share · B⌉ in sorted order."""
        ordered = sorted(set(uids))
        return ordered[: math.ceil(self.eval_share * len(ordered) - 1e-9)]  # 1e-9: 0.3 * 10 is 3, not 4

    def probe_config(self, estimator: str, temperature: float) -> DictConfig:
        """The probe's resolved config for one X estimator under the actor's policy (temperature, top-p = 1)."""
        overrides = OmegaConf.merge(
            OmegaConf.create(PROBE_DEFAULTS),
            OmegaConf.create(self.probe),
            {"generation": {"temperature": temperature, "top_p": 1.0}},
            {"estimator": {"x_estimator_mode": estimator}, "probe": {"preconditioner": "optimizer"}},
        )
        return resolve_config(overrides)


def forecast_settings(rollout_config: Any) -> ForecastSettings | None:
    """``ForecastSettings`` from a rollout config (DictConfig, dict or verl's ``RolloutConfig``), or ``None`` (off).

    Raises:
        ValueError: an unknown key or a bad value, naming ``actor_rollout_ref.rollout.custom.entropy_forecast.<key>``.
    """
    section = plain(read_key(read_key(rollout_config, "custom"), "entropy_forecast"))
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ValueError(f"{SECTION} must be a mapping of {sorted(KEYS)}, got {section!r}")
    if "top_p" in section:
        raise ValueError(
            f"{SECTION}.top_p: not a key (any more): E is sampled at top-p = 1, the policy verl's actor computes its "
            "log-probabilities with; the forecast's directional derivatives need a differentiable policy"
        )
    check_known_keys(section, KEYS, SECTION)
    every = section.get("every", 1)
    if not is_int(every) or every < 1:
        raise ValueError(f"{SECTION}.every must be an integer >= 1, got {every!r}")
    estimators = section.get("estimators", list(ESTIMATORS))
    if (
        isinstance(estimators, str)
        or not estimators
        or any(e not in ESTIMATORS for e in estimators)
        or len(set(estimators)) != len(estimators)
    ):
        raise ValueError(
            f"{SECTION}.estimators must be a non-empty list of distinct {list(ESTIMATORS)}, got {estimators!r}"
        )
    eval_share = section.get("eval_share", 0.5)
    if isinstance(eval_share, bool) or not isinstance(eval_share, int | float) or not 0 < eval_share <= 1:
        raise ValueError(f"{SECTION}.eval_share must be a number in (0, 1], got {eval_share!r}")
    seed = section.get("seed", 0)
    if not is_int(seed) or seed < 0:
        raise ValueError(f"{SECTION}.seed must be an integer >= 0, got {seed!r}")
    method = section.get("method", "auto")
    if method not in METHODS:
        raise ValueError(f"{SECTION}.method must be one of {list(METHODS)}, got {method!r}")
    probe = plain(section.get("probe")) or {}
    if not isinstance(probe, Mapping):
        raise ValueError(f"{SECTION}.probe must be a mapping (a partial probe config), got {probe!r}")
    early_warning = warning_settings(plain(section.get("early_warning")), f"{SECTION}.early_warning")
    record_dir = section.get("record_dir")
    if record_dir is not None and (not isinstance(record_dir, str) or not record_dir):
        raise ValueError(f"{SECTION}.record_dir must be a non-empty path or null, got {record_dir!r}")
    settings = ForecastSettings(
        int(every), tuple(estimators), float(eval_share), int(seed), str(method), dict(probe), early_warning, record_dir
    )
    for estimator in settings.estimators:
        try:
            settings.probe_config(estimator, 1.0)
        except ValueError as error:
            raise ValueError(f"{SECTION}.probe: {error}") from None
    return settings
