# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Acceptance check of an e2e GRPO run from verl's file logger output (``VERL_FILE_LOGGER_PATH``, one JSON line per
``logger.log`` call: ``{"step": n, "data": {metric: value}}``): one record per training step, plus, with
``trainer.val_before_train=True``, a record holding only ``val-*`` metrics at the step before the first trained one.

Every training step must carry a finite ``actor/pg_loss``, a finite ``actor/grad_norm``, > 0 (the update did
something: the reward varied within the GRPO groups) unless every advantage of the step is 0 (``critic/advantages/max`` =
``min`` = 0: all groups' rewards equal, as after an entropy collapse), and at least one step of the run > 0, ``timing_s/agent_loop/rollout_entropy/mean`` > 0 (our rollout entropy reached
the trainer), and verl's ``training/rollout_probs_diff_mean`` / ``training/rollout_actor_probs_pearson_corr`` (the
rollout engine's token probabilities against the actor's recomputation of the same tokens;
``rollout.calculate_log_probs`` must be on). Those two show that the engine serves the weights the actor holds: at
step 1 the initial sync (verl starts the server with ``rollout.load_format=dummy`` weights), from step 2 on the
weights the actor trained (after a resume: the weights loaded from the checkpoint). The optional bounds
``--max-probs-diff`` / ``--min-pearson`` apply to every step. ``--max-entropy-diff X``: the package's end-to-end
alignment metric ``rollout_entropy/actor_abs_diff/mean`` (|rollout entropy - the actor's entropy of the same token|,
logged when both describe the same distribution) is present at every step and at most X. ``--no-entropy``: a run
without the override block (``E2E_BLOCK=0``: stock verl, the stock arm of ``bench_e2e_overhead.py``): the checks that
need the block (rollout entropy mean, its validation counterpart, the entropy agreement) are skipped; the others stay.

Variant checks (``E2E_VARIANT=full|resume`` of ``test_entropy_e2e.sh``):

- ``--first-step N``: the trained steps are exactly N, N+1, ... (a resumed run continues the saved run's numbering).
- ``--kl``: ``actor/kl_loss`` (reference model + ``use_kl_loss``) is finite at every step, ≤ 1e-6 at global step 1
  (the actor starts as the reference model) and > 0 from step 2 on (the actor has moved away from it; after a resume
  this holds only if the trained weights were loaded: the reference model is the initial one).
- ``--val``: validation ran before training (a ``val-*``-only record at step N-1) and at every trained step: finite
  ``val-core/...`` metrics, and ``val-aux/rollout_entropy/mean`` > 0 (the package's validation hook).
- ``--aborted-ratio R`` (over-sampling with abort, ``E2E_OVER_SAMPLE``): at every step the over-sampling metrics,
  the same keys on both stacks (``OVER_SAMPLE_KEYS``: groups and rows kept, aborted and failed, the aborted share and
  tokens, the abort's wait, the reward's two views), ``rollout/aborted_ratio`` equal to R, no failed row, and
  ``rollout/score/completed_mean`` equal to verl's ``critic/score/mean`` (both over completed rows). verl's own
  ``response/aborted_ratio`` (rows with an empty response) is R on verl 0.7.1, whose batch holds the aborted rows
  empty, and 0 on verl 0.9.1, whose replay buffer keeps them out of verl's batch.
- ``--carry-over`` (over-sampling with carry-over, ``E2E_CARRY_OVER=1``): at every step the carry-over metrics, the
  same keys on both stacks (``CARRY_OVER_KEYS``: groups resumed and carried, rows and tokens trained, tokens generated
  / carried / discarded, the discarded share, backlog, the longest wait of a step's prompts and its bound, stale
  restarts), every step's longest wait within the bound, verl's rollout-correction metrics
  (``rollout_corr/...``) are logged, every step after the first resumes the groups the previous one carried, and
  carried rows are trained in at least one step (unless the run is one step from scratch). On verl 0.9.1 (groups
  carried while running; verl's own ``response/aborted_ratio`` 0): the groups carried or dropped are the share
  ``--aborted-ratio`` of each step's groups, a step resumes at most what the previous one carried, and tokens of
  earlier weights are trained in at least one step.
- ``--shaping`` (entropy advantage shaping, ``E2E_SHAPING_ALPHA``): at every step its mean bonus (>= 0) and the share
  of tokens at the cap (in [0, 1]), and steering's cost.
- ``--pg-token-quantile Q`` (forking tokens, ``E2E_PG_TOKEN_QUANTILE``): at every step ``pg_token_mask/kept_share``
  is in ``[Q, Q + 0.05]`` (ties at the threshold are kept), the threshold is logged, and the kept tokens' mean rollout
  entropy is above the dropped ones'.
- ``--same-generations A B``: two validation dumps (``trainer.validation_data_dir``, ``<step>.jsonl``) hold the same
  greedy generations in any order (a resumed run's validation before training against the saved run's validation of the saved
  step: the loaded weights are the saved ones).

    python -m treetune_tests.e2e.check_metrics outputs/e2e/metrics.jsonl --min-steps 2 [--json summary.json]

Exit 0 and a per-step table on success; exit 1 naming every failed check otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

PG_LOSS = "actor/pg_loss"
GRAD_NORM = "actor/grad_norm"
ADVANTAGES_MAX, ADVANTAGES_MIN = "critic/advantages/max", "critic/advantages/min"
ENTROPY_MEAN = "timing_s/agent_loop/rollout_entropy/mean"
PROBS_DIFF = "training/rollout_probs_diff_mean"
PEARSON = "training/rollout_actor_probs_pearson_corr"
KL_LOSS = "actor/kl_loss"
ENTROPY_DIFF = "rollout_entropy/actor_abs_diff/mean"
VAL_CORE_PREFIX = "val-core/"
VAL_ENTROPY_MEAN = "val-aux/rollout_entropy/mean"
ABORTED_RATIO, VERL_ABORTED_RATIO = "rollout/aborted_ratio", "response/aborted_ratio"
ABORTED_GROUPS, ABORT_WAIT = "rollout/aborted_groups", "rollout/abort_wait_s"
KEPT_GROUPS = "rollout/kept_groups"
SHAPING_BONUS, SHAPING_CAPPED = "entropy_advantage/bonus_mean", "entropy_advantage/capped_share"
# Over-sampling's metrics on both stacks (issue 49), written here as the reference the package's are checked against.
OVER_SAMPLE_KEYS = (
    "rollout/kept_groups",
    "rollout/aborted_groups",
    "rollout/failed_groups",
    "rollout/aborted_rows",
    "rollout/failed_rows",
    "rollout/aborted_ratio",
    "rollout/aborted_tokens",
    "rollout/abort_wait_s",
    "rollout/score/completed_mean",
    "rollout/score/aborted_as_zero_mean",
)
COMPLETED_SCORE, ZERO_SCORE, VERL_SCORE = (
    "rollout/score/completed_mean",
    "rollout/score/aborted_as_zero_mean",
    "critic/score/mean",
)
# actor/kl_loss at global step 1, where the actor is the reference model (same weights, both fp32 on CPU: 0.0 measured)
KL_AT_START_MAX = 1e-6
REPORTED = (
    PG_LOSS,
    GRAD_NORM,
    ENTROPY_MEAN,
    ENTROPY_DIFF,
    PROBS_DIFF,
    PEARSON,
    "critic/score/mean",
    "timing_s/step",
    "timing_s/treetune/total",
)
KEPT_SHARE, THRESHOLD = "pg_token_mask/kept_share", "pg_token_mask/threshold"
KEPT_ENTROPY, DROPPED_ENTROPY = "pg_token_mask/entropy_kept_mean", "pg_token_mask/entropy_dropped_mean"
# The live entropy forecast (treetune_verl/forecast): keys logged at every probed step, finite.
FORECAST_KEYS = (
    "probe/deltaH1/naive",
    "probe/deltaH1/rb_residual",
    "probe/deltaH1_se/naive",
    "probe/deltaH1_se/rb_residual",
    "probe/deltaH_realised",
    "probe/deltaH_realised_se",
    "probe/deltaH_realised_first_step",
    # E's token entropy (forecast/token_entropy.py): the calibrated forecast, the realised change, their paired SE
    "probe/token/H_before",
    "probe/token/deltaH1",
    "probe/token/deltaH1_se",
    "probe/token/deltaH_realised_first_step",
    "probe/token/deltaH_realised_first_step_se",
    "probe/token/deltaH_realised",
    "probe/token/error_se",
    # the forecast exact in the softmax (forecast/softmax_tangent.py; float32 actors, as every CPU e2e run's)
    "probe/token/deltaH_softmax",
    "probe/token/softmax_error_se",
    "timing_s/probe",
    "probe/cost_ratio",
    # the early warning (forecast/early_warning.py): the projection and both warnings, every forecast
    "probe/warning/entropy",
    "probe/warning/rate",
    "probe/warning/rate_se",
    "probe/warning/steps_to_fraction",
    "probe/warning/disagree_streak",
    "probe/warning/collapse",
    "probe/warning/disagree",
)
# Standard errors over E's prompts: logged when E has two or more. Over-sampling drops a group's E with the group
# (its requests cut at the abort), so a step's E may keep one of two prompts.
PROMPT_SE_KEYS = ("probe/deltaH1_se/naive", "probe/deltaH1_se/rb_residual", "probe/deltaH_realised_se")
EVAL_PROMPTS = "probe/eval_prompts"
TREETUNE_TIMING = "timing_s/treetune/"  # treetune_verl/timing.py: wall seconds the step waited on our code
TREETUNE_CPU = "cpu_s/treetune/"  # and our CPU seconds, every process
TREETUNE_SHARE = "treetune/share_of_step"
TIE_TOLERANCE = 0.05  # how far above Q the kept share may go through ties at the threshold
VARIANT_REPORTED = (KL_LOSS, VAL_ENTROPY_MEAN, ABORTED_RATIO, COMPLETED_SCORE, ZERO_SCORE, KEPT_SHARE, THRESHOLD)


def read_steps(path: Path) -> list[dict]:
    """Every record of the file, in order, as ``{"step": n, **metrics}`` (validation-only records included)."""
    steps = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.append({"step": record["step"], **record["data"]})
    return steps


def is_validation_only(metrics: dict) -> bool:
    """A record of ``val-*`` metrics alone: verl's validation before training (``ray_trainer.fit``)."""
    keys = [key for key in metrics if key != "step"]
    return bool(keys) and all(key.startswith("val-") for key in keys)


def training_steps(steps: list[dict]) -> list[dict]:
    return [metrics for metrics in steps if not is_validation_only(metrics)]


def val_core(metrics: dict) -> dict[str, float]:
    return {key: value for key, value in metrics.items() if key.startswith(VAL_CORE_PREFIX)}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _need(errors: list[str], metrics: dict, key: str, ok, what: str) -> None:
    value = metrics.get(key)
    if value is None:
        errors.append(f"step {metrics['step']}: {key} missing")
    elif not _finite(value) or not ok(value):
        errors.append(f"step {metrics['step']}: {key} = {value!r}, expected {what}")


def check(
    steps: list[dict],
    min_steps: int = 2,
    max_probs_diff: float | None = None,
    min_pearson: float | None = None,
    *,
    first_step: int | None = None,
    kl: bool = False,
    val: bool = False,
    max_entropy_diff: float | None = None,
    entropy: bool = True,
    aborted_ratio: float | None = None,
    carry_over: bool = False,
    pg_token_quantile: float | None = None,
    shaping: bool = False,
    forecast_every: int | None = None,
) -> list[str]:
    """Every failed acceptance check, as a message (empty: accepted). ``steps``: all records (``read_steps``)."""
    errors: list[str] = []
    if not entropy and max_entropy_diff is not None:
        raise ValueError("max_entropy_diff needs the override block (entropy=True)")
    trained = training_steps(steps)
    if len(trained) < min_steps:
        errors.append(f"{len(trained)} training step(s) logged, expected at least {min_steps}")
    numbers = [metrics["step"] for metrics in trained]
    if first_step is not None and numbers != list(range(first_step, first_step + len(numbers))):
        errors.append(f"training steps {numbers}, expected consecutive steps from {first_step}")
    stale = "the engine does not serve the actor's weights: weight sync broken?"
    for metrics in trained:
        _need(errors, metrics, PG_LOSS, lambda v: True, "a finite number")
        _check_gradient(errors, metrics)
        if entropy:
            _need(errors, metrics, ENTROPY_MEAN, lambda v: v > 0, "> 0 (rollout entropy not served: block in?)")
            _check_timing(errors, metrics, aborted_ratio is not None, pg_token_quantile is not None or shaping)
        _need(errors, metrics, PROBS_DIFF, lambda v: True, "a finite number (needs rollout.calculate_log_probs=True)")
        _need(errors, metrics, PEARSON, lambda v: True, "a finite number (needs rollout.calculate_log_probs=True)")
        if max_probs_diff is not None:
            _need(errors, metrics, PROBS_DIFF, lambda v: v <= max_probs_diff, f"<= {max_probs_diff} ({stale})")
        if min_pearson is not None:
            _need(errors, metrics, PEARSON, lambda v: v >= min_pearson, f">= {min_pearson} ({stale})")
        if max_entropy_diff is not None:
            _need(
                errors,
                metrics,
                ENTROPY_DIFF,
                lambda v: v <= max_entropy_diff,
                f"<= {max_entropy_diff} (rollout entropy and the actor's entropy of the same tokens disagree)",
            )
        if kl:
            if metrics["step"] <= 1:
                _need(
                    errors,
                    metrics,
                    KL_LOSS,
                    lambda v: 0 <= v <= KL_AT_START_MAX,
                    f"in [0, {KL_AT_START_MAX}] at step 1 (the actor starts as the reference model)",
                )
            else:
                _need(
                    errors,
                    metrics,
                    KL_LOSS,
                    lambda v: v > 0,
                    "> 0 after step 1 (actor equal to the reference: update or checkpoint load lost?)",
                )
        if val:
            _check_validation(errors, metrics, entropy)
        if aborted_ratio is not None:
            _check_over_sampling(errors, metrics, aborted_ratio)
        if pg_token_quantile is not None:
            _check_forking_tokens(errors, metrics, pg_token_quantile)
        if shaping:
            _need(errors, metrics, SHAPING_BONUS, lambda v: v >= 0, ">= 0 (advantage shaping's mean bonus)")
            _need(
                errors, metrics, SHAPING_CAPPED, lambda v: 0 <= v <= 1, "in [0, 1] (advantage shaping's capped share)"
            )
        if forecast_every is not None and (metrics["step"] - trained[0]["step"]) % forecast_every == 0:
            _need(errors, metrics, EVAL_PROMPTS, lambda v: v >= 1, ">= 1 (E's prompts at a probed step)")
            several = _finite(metrics.get(EVAL_PROMPTS)) and metrics[EVAL_PROMPTS] >= 2
            for key in FORECAST_KEYS:
                if key in PROMPT_SE_KEYS and not several:
                    continue  # a standard error over one prompt is undefined: the forecast logs none
                _need(errors, metrics, key, lambda v: True, "a finite number (the forecast block's probed step)")
    if trained and not any(_finite(m.get(GRAD_NORM)) and m[GRAD_NORM] > 0 for m in trained):
        errors.append(f"no training step with {GRAD_NORM} > 0: the run never updated the actor")
    if carry_over:
        _check_carry_over(errors, trained)
    if val and trained:
        before = [m for m in steps if is_validation_only(m) and m["step"] == trained[0]["step"] - 1]
        if not before:
            errors.append(f"no validation-only record at step {trained[0]['step'] - 1} (val_before_train)")
        for metrics in before:
            _check_validation(errors, metrics, entropy)
    return errors


def _check_gradient(errors: list[str], metrics: dict) -> None:
    """A finite ``actor/grad_norm``, > 0 unless the step's advantages are all zero (every GRPO group's rewards equal,
    as after an entropy collapse: nothing to learn from, verl's zero gradient is right; Adam's momentum still moves)."""
    _need(errors, metrics, GRAD_NORM, lambda v: True, "a finite number")
    if not _finite(metrics.get(GRAD_NORM)) or metrics[GRAD_NORM] > 0:
        return
    advantages = [metrics.get(key) for key in (ADVANTAGES_MAX, ADVANTAGES_MIN)]
    if not all(_finite(a) and a == 0 for a in advantages):
        errors.append(
            f"step {metrics['step']}: {GRAD_NORM} = {metrics[GRAD_NORM]!r} with non-zero advantages "
            f"({ADVANTAGES_MIN} = {advantages[1]!r}, {ADVANTAGES_MAX} = {advantages[0]!r}): the update lost its gradient"
        )


def _check_timing(errors: list[str], metrics: dict, over_sampling: bool, steering: bool) -> None:
    """Every feature's cost (timing.py: the step's wait on it and its CPU seconds): logged at every step, > 0 for the
    features on, the wait's share of the step < 1."""
    on = {"rollout_entropy": True, "trainer_hooks": True, "over_sampling": over_sampling, "steering": steering}
    for feature, running in on.items():
        check, what = (lambda v: v > 0, "> 0 (the feature ran)") if running else (lambda v: v >= 0, ">= 0")
        for prefix in (TREETUNE_TIMING, TREETUNE_CPU):
            _need(errors, metrics, prefix + feature, check, what)
    _need(errors, metrics, TREETUNE_SHARE, lambda v: 0 < v < 1, "in (0, 1): our code's share of timing_s/step")


def _check_over_sampling(errors: list[str], metrics: dict, aborted_ratio: float) -> None:
    """The same keys on both stacks (issue 49); the target's share aborted (or, with carry-over, carried or
    dropped); verl's own ``response/aborted_ratio``: 0 on verl 0.9.1, whose replay buffer keeps aborted rows out of
    verl's batch, the aborted share on verl 0.7.1, whose batch holds them as empty rows."""
    for key in OVER_SAMPLE_KEYS:
        _need(errors, metrics, key, lambda v: v >= 0, ">= 0 (over-sampling's metrics, the same on both stacks)")
    not_kept = metrics.get(ABORTED_RATIO, -1)  # the share of rows not kept, which verl 0.7.1's batch holds empty
    if CARRY_OVER + "groups_carried" in metrics and ABORTED_GROUPS in metrics:  # carry-over: the groups not kept
        left = metrics[CARRY_OVER + "groups_carried"] + metrics[ABORTED_GROUPS]  # are carried or dropped
        not_kept = left / (left + metrics.get(KEPT_GROUPS, 0))
        if abs(not_kept - aborted_ratio) > 1e-9:
            errors.append(f"step {metrics['step']}: {not_kept} of the groups carried or dropped, not {aborted_ratio}")
    else:
        _need(errors, metrics, ABORTED_RATIO, lambda v: abs(v - aborted_ratio) < 1e-9, f"{aborted_ratio}")
    _need(
        errors,
        metrics,
        VERL_ABORTED_RATIO,
        lambda v: v == 0 or abs(v - not_kept) < 1e-9,
        f"0 (verl 0.9.1: no aborted row in verl's batch) or {not_kept} (verl 0.7.1: the rows not kept, empty)",
    )
    verl_score = metrics.get(VERL_SCORE)
    _need(errors, metrics, COMPLETED_SCORE, lambda v: abs(v - verl_score) < 1e-6, f"{VERL_SCORE} ({verl_score})")
    _need(errors, metrics, "rollout/failed_rows", lambda v: v == 0, "0 (no agent loop raised)")


CARRY_OVER = "rollout/carry_over/"
CARRY_OVER_KEYS = tuple(
    CARRY_OVER + key
    for key in (
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


def _check_carry_over(errors: list[str], trained: list[dict]) -> None:
    # verl 0.9.1's replay buffer keeps a carried group once it finishes: a step resumes at most what the previous one
    # left running; verl 0.7.1's manager resumes every carried group at the next step
    # the same keys on both stacks (issue 49); verl 0.7.1's batch holds the aborted rows (verl's response/aborted_ratio)
    v1 = bool(trained) and trained[0].get(VERL_ABORTED_RATIO) == 0
    previous = None
    for metrics in trained:
        for key in CARRY_OVER_KEYS:
            _need(errors, metrics, key, lambda v: v >= 0, ">= 0 (carry-over on)")
        bound = metrics.get(CARRY_OVER + "prompt_wait_bound")
        _need(errors, metrics, CARRY_OVER + "prompt_wait_max", lambda v, b=bound: v <= b, f"<= {bound} (the bound)")
        if not any(key.startswith("rollout_corr/") for key in metrics):
            errors.append(f"step {metrics['step']}: no rollout_corr/ metric (algorithm.rollout_correction off?)")
        if previous is not None:
            c = previous.get(CARRY_OVER + "groups_carried")
            ok = (lambda v, c=c: v <= c) if v1 else (lambda v, c=c: v == c)
            _need(errors, metrics, CARRY_OVER + "groups_resumed", ok, f"<= {c}" if v1 else f"{c} (carried)")
        previous = metrics
    trained_key, what = (
        ("tokens_trained", "no token of an earlier step's weights") if v1 else ("rows_trained", "no carried row")
    )
    # a run of one step from scratch (the every-feature pair's first half) carries groups but cannot train them yet
    could_train = len(trained) >= 2 or (bool(trained) and trained[0]["step"] > 1)
    if could_train and not sum(m.get(CARRY_OVER + trained_key, 0) for m in trained):
        errors.append(f"{what} was trained in any step")


def _check_forking_tokens(errors: list[str], metrics: dict, quantile: float) -> None:
    high = quantile + TIE_TOLERANCE
    _need(errors, metrics, KEPT_SHARE, lambda v: quantile <= v <= high, f"in [{quantile}, {high}]")
    _need(errors, metrics, THRESHOLD, lambda v: v >= 0, ">= 0 nats")
    dropped = metrics.get(DROPPED_ENTROPY)
    _need(errors, metrics, KEPT_ENTROPY, lambda v: dropped is None or v > dropped, f"> {DROPPED_ENTROPY} ({dropped})")


def _check_validation(errors: list[str], metrics: dict, entropy: bool = True) -> None:
    core = val_core(metrics)
    if not core:
        errors.append(f"step {metrics['step']}: no {VAL_CORE_PREFIX}* metric (validation did not run?)")
    for key in core:
        _need(errors, metrics, key, lambda v: True, "a finite number")
    if entropy:
        _need(errors, metrics, VAL_ENTROPY_MEAN, lambda v: v > 0, "> 0 (rollout entropy of the validation rollouts)")


def read_generations(path: Path) -> list[dict]:
    """A validation dump of verl's ``_dump_generations`` (``trainer.validation_data_dir/<step>.jsonl``)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def same_generations(a: Path, b: Path) -> list[str]:
    """Errors unless the two dumps hold the same (input, output) pairs, in any order (verl 0.9.1 orders its dump by
    each row's random uid; 0.7.1 by the dataset); rows are reported by their position in input order."""
    errors = []
    for path in (a, b):
        if not Path(path).exists():
            errors.append(f"{path} does not exist (trainer.validation_data_dir set?)")
    if errors:
        return errors
    rows_a, rows_b = read_generations(a), read_generations(b)
    pairs_a = sorted((row["input"], row["output"]) for row in rows_a)
    pairs_b = sorted((row["input"], row["output"]) for row in rows_b)
    if len(pairs_a) != len(pairs_b) or not pairs_a:
        return [f"{a}: {len(pairs_a)} generations, {b}: {len(pairs_b)}"]
    differing = [i for i, (x, y) in enumerate(zip(pairs_a, pairs_b, strict=True)) if x != y]
    if differing:
        errors.append(
            f"{len(differing)} of {len(pairs_a)} greedy validation generations differ between {a} and {b} "
            f"(rows {differing}): not the same weights?"
        )
    return errors


def table(steps: list[dict]) -> str:
    extra = [key for key in VARIANT_REPORTED if any(key in metrics for metrics in steps)]
    core = sorted({key for metrics in steps for key in val_core(metrics)})
    header = ["step", *REPORTED, *extra, *core]
    lines = ["\t".join(header)]
    for metrics in steps:
        values = [metrics.get(key) for key in header[1:]]
        lines.append("\t".join([str(metrics["step"]), *(f"{v:.6g}" if _finite(v) else str(v) for v in values)]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path)
    parser.add_argument("--min-steps", type=int, default=2)
    parser.add_argument("--max-probs-diff", type=float, default=None)
    parser.add_argument("--min-pearson", type=float, default=None)
    parser.add_argument("--max-entropy-diff", type=float, default=None, help=f"bound on {ENTROPY_DIFF}")
    parser.add_argument("--first-step", type=int, default=None, help="the trained steps are exactly N, N+1, ...")
    parser.add_argument("--kl", action="store_true", help="reference model + KL loss: check actor/kl_loss")
    parser.add_argument("--val", action="store_true", help="validation before training and at every step")
    parser.add_argument("--same-generations", nargs=2, type=Path, metavar=("A", "B"), default=None)
    parser.add_argument(
        "--no-entropy", action="store_true", help="a run without the override block: skip the entropy checks"
    )
    parser.add_argument("--aborted-ratio", type=float, default=None, help="over-sampling: expected aborted share")
    parser.add_argument("--carry-over", action="store_true", help="over-sampling with carry-over: its metrics")
    parser.add_argument("--pg-token-quantile", type=float, default=None, help="forking tokens: the configured q")
    parser.add_argument("--shaping", action="store_true", help="entropy advantage shaping: its metrics every step")
    parser.add_argument("--json", type=Path, default=None, help="also write the per-step acceptance metrics here")
    parser.add_argument(
        "--forecast-every", type=int, default=None, help="entropy forecast: its keys finite every k-th trained step"
    )
    args = parser.parse_args(argv)
    if args.no_entropy and args.max_entropy_diff is not None:
        parser.error("--max-entropy-diff needs the override block: not with --no-entropy")
    if not args.metrics.exists():
        print(f"FAIL: {args.metrics} does not exist (did the trainer run with trainer.logger=[...,file]?)")
        return 1
    steps = read_steps(args.metrics)
    print(table(steps))
    if args.json is not None:
        keys = ("step", *REPORTED, *VARIANT_REPORTED, *(FORECAST_KEYS if args.forecast_every else ()))
        summary = [{k: m.get(k) for k in keys} | val_core(m) for m in steps]
        args.json.write_text(json.dumps(summary, indent=1))
    errors = check(
        steps,
        args.min_steps,
        args.max_probs_diff,
        args.min_pearson,
        first_step=args.first_step,
        kl=args.kl,
        val=args.val,
        max_entropy_diff=args.max_entropy_diff,
        entropy=not args.no_entropy,
        aborted_ratio=args.aborted_ratio,
        carry_over=args.carry_over,
        pg_token_quantile=args.pg_token_quantile,
        shaping=args.shaping,
        forecast_every=args.forecast_every,
    )
    if args.same_generations is not None:
        errors += same_generations(*args.same_generations)
    for error in errors:
        print(f"FAIL: {error}")
    if not errors:
        print(f"OK: {len(training_steps(steps))} step(s) in {args.metrics} pass the e2e acceptance checks")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
