# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``check_metrics.py`` on synthetic verl file-logger records (fast): the base checks, the validation-only record of
``val_before_train``, and the variant checks (``--first-step``, ``--kl``, ``--val``, ``--same-generations``)."""

from __future__ import annotations

import json

import pytest

from treetune_tests.e2e.check_metrics import (
    ADVANTAGES_MAX,
    ADVANTAGES_MIN,
    CARRY_OVER,
    CARRY_OVER_KEYS,
    ENTROPY_DIFF,
    ENTROPY_MEAN,
    EVAL_PROMPTS,
    FORECAST_KEYS,
    GRAD_NORM,
    KL_LOSS,
    OVER_SAMPLE_KEYS,
    PEARSON,
    PG_LOSS,
    PROBS_DIFF,
    PROMPT_SE_KEYS,
    TREETUNE_CPU,
    TREETUNE_SHARE,
    TREETUNE_TIMING,
    VAL_ENTROPY_MEAN,
    check,
    is_validation_only,
    main,
    read_steps,
    same_generations,
    training_steps,
)
from treetune_tests.e2e.feature_shares import feature_shares, table

VAL_CORE = "val-core/treetune/arithmetic/acc/mean@1"
# What treetune_verl/timing.py logs for a run with the block only (over-sampling and steering off: 0 s).
TIMING = {
    TREETUNE_TIMING + "rollout_entropy": 0.01,
    TREETUNE_TIMING + "trainer_hooks": 0.002,
    TREETUNE_TIMING + "over_sampling": 0.0,
    TREETUNE_TIMING + "steering": 0.0,
    TREETUNE_CPU + "rollout_entropy": 0.008,
    TREETUNE_CPU + "trainer_hooks": 0.002,
    TREETUNE_CPU + "over_sampling": 0.0,
    TREETUNE_CPU + "steering": 0.0,
    TREETUNE_SHARE: 0.004,
}


def _train(step: int, **extra) -> dict:
    return {
        "step": step,
        PG_LOSS: 1e-8,
        GRAD_NORM: 5.0,
        ENTROPY_MEAN: 2.0,
        PROBS_DIFF: 2e-7,
        PEARSON: 1.0,
        **TIMING,
        **extra,
    }


def _val(step: int) -> dict:
    return {"step": step, VAL_CORE: 0.08, VAL_ENTROPY_MEAN: 1.9}


def _full(step: int, kl: float) -> dict:
    return _train(step, **{KL_LOSS: kl}) | _val(step)


def test_base_run_passes_and_counts_training_steps_only():
    steps = [_train(1), _train(2)]
    assert check(steps, min_steps=2, max_probs_diff=1e-3, min_pearson=0.999) == []
    assert check([_val(0), _train(1)], min_steps=2) == ["1 training step(s) logged, expected at least 2"]


def test_base_checks_name_each_failure():
    bad = _train(1, **{GRAD_NORM: 0.0, ENTROPY_MEAN: float("nan")})
    del bad[PEARSON]
    errors = check([bad], min_steps=1, max_probs_diff=1e-3)
    assert any(GRAD_NORM in e for e in errors) and any(ENTROPY_MEAN in e for e in errors)
    assert any(f"{PEARSON} missing" in e for e in errors)
    assert check([_train(1, **{PROBS_DIFF: 0.03})], min_steps=1, max_probs_diff=1e-3) != []


def test_a_zero_gradient_passes_only_when_every_advantage_is_zero_and_some_step_updated():
    """After an entropy collapse every GRPO group's rewards are equal: advantages 0, verl's gradient 0. That step
    passes; a zero gradient with non-zero advantages fails, and so does a run with no real update at all."""
    flat = {GRAD_NORM: 0.0, ADVANTAGES_MAX: 0.0, ADVANTAGES_MIN: 0.0}
    assert check([_train(1), _train(2, **flat), _train(3)], min_steps=3) == []
    lost = check([_train(1), _train(2, **{**flat, ADVANTAGES_MAX: 0.7})], min_steps=2)
    assert len(lost) == 1 and "step 2" in lost[0] and "non-zero advantages" in lost[0]
    unexplained = check([_train(1), _train(2, **{GRAD_NORM: 0.0})], min_steps=2)  # advantages not logged
    assert len(unexplained) == 1 and "step 2" in unexplained[0]
    never = check([_train(1, **flat), _train(2, **flat)], min_steps=2)
    assert never == [f"no training step with {GRAD_NORM} > 0: the run never updated the actor"]
    assert any("finite" in e for e in check([_train(1, **{GRAD_NORM: float("nan")})], min_steps=1))


def test_a_probed_step_needs_every_forecast_key_and_the_prompts_standard_errors_from_two_prompts():
    """Over-sampling drops a group's E with it: a step may keep one of E's two prompts, and a standard error over
    one prompt is undefined (the forecast logs none); every other forecast key is still required."""
    forecast = dict.fromkeys(FORECAST_KEYS, 0.1)
    one_prompt = {k: v for k, v in forecast.items() if k not in PROMPT_SE_KEYS} | {EVAL_PROMPTS: 1.0}
    assert check([_train(1, **forecast, **{EVAL_PROMPTS: 2.0})], min_steps=1, forecast_every=1) == []
    assert check([_train(1, **one_prompt)], min_steps=1, forecast_every=1) == []
    errors = check([_train(1, **one_prompt | {EVAL_PROMPTS: 2.0})], min_steps=1, forecast_every=1)
    assert sorted(e.split(": ")[1] for e in errors) == sorted(f"{key} missing" for key in PROMPT_SE_KEYS)
    assert check([_train(1, **forecast)], min_steps=1, forecast_every=1) == [f"step 1: {EVAL_PROMPTS} missing"]


def test_validation_only_records_are_told_apart():
    assert is_validation_only(_val(0)) and not is_validation_only(_full(1, 0.0))
    assert not is_validation_only({"step": 3})
    assert [m["step"] for m in training_steps([_val(0), _full(1, 0.0)])] == [1]


def test_full_variant_passes():
    steps = [_val(0), _full(1, 0.0), _full(2, 0.02)]
    assert check(steps, min_steps=2, first_step=1, kl=True, val=True) == []


def test_resumed_run_numbering():
    steps = [_val(1), _full(2, 0.02)]
    assert check(steps, min_steps=1, first_step=2, kl=True, val=True) == []
    errors = check([_val(0), _full(1, 0.0)], min_steps=1, first_step=2)
    assert errors == ["training steps [1], expected consecutive steps from 2"]


@pytest.mark.parametrize("step, kl", [(1, 0.01), (2, 0.0), (2, float("nan"))])
def test_kl_loss_bounds(step, kl):
    steps = [_val(step - 1), _full(step, kl)]
    errors = check(steps, min_steps=1, first_step=step, kl=True, val=True)
    assert len(errors) == 1 and KL_LOSS in errors[0]


def test_kl_loss_missing_fails():
    assert check([_train(1)], min_steps=1, kl=True) == [f"step 1: {KL_LOSS} missing"]


def test_validation_checks():
    no_before = check([_full(1, 0.0)], min_steps=1, val=True)
    assert no_before == ["no validation-only record at step 0 (val_before_train)"]
    no_core = _full(1, 0.0)
    del no_core[VAL_CORE]
    errors = check([_val(0), no_core], min_steps=1, val=True)
    assert errors == ["step 1: no val-core/* metric (validation did not run?)"]
    no_entropy = _val(0)
    del no_entropy[VAL_ENTROPY_MEAN]
    errors = check([no_entropy, _full(1, 0.0)], min_steps=1, val=True)
    assert errors == [f"step 0: {VAL_ENTROPY_MEAN} missing"]


def _dump(path, outputs, order=None):
    rows = [{"input": f"q{i}", "output": out, "score": 0.1, "step": 1} for i, out in enumerate(outputs)]
    rows = [rows[i] for i in order] if order is not None else rows
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_same_generations(tmp_path):
    a = _dump(tmp_path / "a.jsonl", ["x", "y", "z"])
    assert same_generations(a, _dump(tmp_path / "b.jsonl", ["x", "y", "z"])) == []
    [error] = same_generations(a, _dump(tmp_path / "c.jsonl", ["x", "Y", "z"]))
    assert "1 of 3 greedy validation generations differ" in error and "rows [1]" in error
    assert same_generations(a, tmp_path / "missing.jsonl")[0].endswith("(trainer.validation_data_dir set?)")
    assert same_generations(a, _dump(tmp_path / "d.jsonl", ["x"])) != []
    # verl 0.9.1 orders its dump by each row's random uid: the same generations in another order are the same
    assert same_generations(a, _dump(tmp_path / "e.jsonl", ["x", "y", "z"], order=[2, 0, 1])) == []


def test_cli_reads_the_file_logger_format(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    records = [_val(0), _full(1, 0.0)]
    path.write_text(  # verl's FileLogger: {"step": n, "data": {metric: value}}
        "\n".join(json.dumps({"step": r["step"], "data": {k: v for k, v in r.items() if k != "step"}}) for r in records)
    )
    assert [m["step"] for m in read_steps(path)] == [0, 1]
    summary = tmp_path / "summary.json"
    assert main([str(path), "--min-steps", "1", "--first-step", "1", "--kl", "--val", "--json", str(summary)]) == 0
    assert "OK: 1 step(s)" in capsys.readouterr().out
    rows = json.loads(summary.read_text())
    assert rows[1][KL_LOSS] == 0.0 and rows[0][VAL_CORE] == 0.08
    assert main([str(path), "--min-steps", "2"]) == 1


def test_entropy_agreement_bound():
    """``--max-entropy-diff``: the rollout-vs-actor entropy metric must be logged at every step and within bound."""
    good = [_train(1, **{ENTROPY_DIFF: 1.1e-6}), _train(2, **{ENTROPY_DIFF: 1.2e-6})]
    assert check(good, min_steps=2, max_entropy_diff=1e-3) == []
    far = [_train(1, **{ENTROPY_DIFF: 0.2}), _train(2)]
    errors = check(far, min_steps=2, max_entropy_diff=1e-3)
    assert len(errors) == 2
    assert errors[0].startswith(f"step 1: {ENTROPY_DIFF} = 0.2, expected <= 0.001")
    assert errors[1] == f"step 2: {ENTROPY_DIFF} missing"
    assert check(far, min_steps=2) == []  # without the bound nothing is required


def test_no_entropy_skips_only_the_block_checks(tmp_path, capsys):
    """``--no-entropy`` (the stock arm, ``E2E_BLOCK=0``): no rollout entropy metric is required; the rest still is."""
    stock = [_train(1), _train(2)]
    for metrics in stock:
        del metrics[ENTROPY_MEAN]
    assert check(stock, min_steps=2) == [f"step {s}: {ENTROPY_MEAN} missing" for s in (1, 2)]
    assert check(stock, min_steps=2, max_probs_diff=1e-3, min_pearson=0.999, entropy=False) == []
    stock_val = [_val(0), _full(1, 0.0)]
    for metrics in stock_val:
        del metrics[VAL_ENTROPY_MEAN]
    assert check(stock_val, min_steps=1, kl=True, val=True, entropy=False) == []
    bad = [_train(1, **{PROBS_DIFF: 0.03, GRAD_NORM: 0.0}), _train(2)]
    del bad[0][ENTROPY_MEAN]
    errors = check(bad, min_steps=1, max_probs_diff=1e-3, entropy=False)
    assert len(errors) == 2 and any(PROBS_DIFF in e for e in errors) and any(GRAD_NORM in e for e in errors)
    with pytest.raises(ValueError):
        check(stock, min_steps=2, max_entropy_diff=1e-3, entropy=False)
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps({"step": m["step"], "data": m}) for m in stock))
    assert main([str(path), "--min-steps", "2"]) == 1
    assert main([str(path), "--min-steps", "2", "--no-entropy"]) == 0
    assert "OK: 2 step(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(path), "--no-entropy", "--max-entropy-diff", "1e-3"])


def test_timing_checks_every_feature_and_the_share():
    assert check([_train(1)], min_steps=1) == []
    missing = {k: v for k, v in _train(1).items() if k != TREETUNE_TIMING + "trainer_hooks"}
    assert any("timing_s/treetune/trainer_hooks missing" in e for e in check([missing], min_steps=1))
    no_cpu = {k: v for k, v in _train(1).items() if k != TREETUNE_CPU + "rollout_entropy"}
    assert any("cpu_s/treetune/rollout_entropy missing" in e for e in check([no_cpu], min_steps=1))
    idle = check([_train(1)], min_steps=1, pg_token_quantile=0.2)  # steering on but 0 s: it did not run
    assert any(TREETUNE_TIMING + "steering" in e for e in idle)
    assert any(TREETUNE_SHARE in e for e in check([_train(1, **{TREETUNE_SHARE: 1.5})], min_steps=1))
    assert check([{k: v for k, v in _train(1).items() if "treetune" not in k}], min_steps=1, entropy=False) == []


def test_feature_shares_are_medians_over_the_steps_after_the_first():
    steps = [
        _train(1, **{"timing_s/step": 20.0, TREETUNE_TIMING + "steering": 5.0}),  # warm-up: dropped
        _train(2, **{"timing_s/step": 10.0, TREETUNE_TIMING + "steering": 0.1, TREETUNE_CPU + "steering": 0.05}),
        _train(3, **{"timing_s/step": 5.0, TREETUNE_TIMING + "steering": 0.1, TREETUNE_CPU + "steering": 0.07}),
        _train(4, **{"timing_s/step": 10.0, TREETUNE_TIMING + "steering": 0.3, TREETUNE_CPU + "steering": 0.2}),
    ]
    shares = feature_shares(steps)
    assert shares["steering"] == {
        "median_s": 0.1,
        "min_s": 0.1,
        "max_s": 0.3,
        "median_share": 0.02,
        "median_cpu_s": 0.07,
    }
    assert shares["rollout_entropy"]["median_share"] == pytest.approx(0.001)
    assert shares["step"]["median_s"] == 10.0 and "median_share" not in shares["step"]
    assert "steering" in table(shares)
    with pytest.raises(ValueError, match="at least 2 steps"):
        feature_shares(steps[:1])


def _carried(step: int, resumed: int, carried: int, trained_rows: int) -> dict:
    counts = dict.fromkeys(CARRY_OVER_KEYS, 0.0)
    counts |= {
        CARRY_OVER + "groups_resumed": resumed,
        CARRY_OVER + "groups_carried": carried,
        CARRY_OVER + "rows_trained": trained_rows,
    }
    return _train(step, **counts, **{"rollout_corr/rollout_is_mean": 1.0})


def test_carry_over_checks():
    steps = [_carried(1, 0, 1, 0), _carried(2, 1, 1, 2), _carried(3, 1, 0, 1)]
    assert check(steps, min_steps=3, carry_over=True) == []
    lost = [_carried(1, 0, 1, 0), _carried(2, 0, 1, 2)]  # step 1 carried a group that step 2 did not resume
    assert any("groups_resumed" in e for e in check(lost, min_steps=2, carry_over=True))
    never = [_carried(1, 0, 1, 0), _carried(2, 1, 0, 0)]
    assert "no carried row was trained in any step" in check(never, min_steps=2, carry_over=True)
    assert check(never[:1], min_steps=1, carry_over=True) == []  # one step from scratch: nothing to train yet
    resumed = [_carried(2, 1, 0, 0)]  # a resumed run's step (the pair's second half) must train what it resumed
    assert "no carried row was trained in any step" in check(resumed, min_steps=1, carry_over=True)
    waited_too_long = [m | {CARRY_OVER + "prompt_wait_max": 3, CARRY_OVER + "prompt_wait_bound": 2} for m in steps]
    assert any("prompt_wait_max" in e and "<= 2" in e for e in check(waited_too_long, min_steps=3, carry_over=True))
    no_correction = [{k: v for k, v in m.items() if not k.startswith("rollout_corr/")} for m in steps]
    assert any("no rollout_corr/ metric" in e for e in check(no_correction, min_steps=3, carry_over=True))
    missing = [{k: v for k, v in m.items() if k != CARRY_OVER + "backlog"} for m in steps]
    assert any("backlog" in e for e in check(missing, min_steps=3, carry_over=True))


def _over_sampled(**overrides) -> dict:
    """Every over-sampling key (both stacks log the same ones), one group of 4 aborted, the kept rows scoring 0.5."""
    logged = {
        TREETUNE_TIMING + "over_sampling": 0.05,
        TREETUNE_CPU + "over_sampling": 0.01,
        "rollout/kept_groups": 3,
        "rollout/aborted_groups": 1,
        "rollout/failed_groups": 0,
        "rollout/aborted_rows": 2,
        "rollout/failed_rows": 0,
        "rollout/aborted_ratio": 0.25,
        "rollout/aborted_tokens": 40,
        "rollout/abort_wait_s": 0.1,
        "rollout/score/completed_mean": 0.5,
        "rollout/score/aborted_as_zero_mean": 0.375,
        "critic/score/mean": 0.5,
        "response/aborted_ratio": 0.0,
    }
    return logged | overrides


def test_over_sampling_checks_the_same_keys_on_both_stacks():
    """verl 0.9.1 keeps the aborted rows out of verl's batch (verl's own aborted ratio 0), verl 0.7.1 holds them empty
    (verl's ratio is ours); anything else, a missing key, a failed row or a ratio other than the target's fails."""
    for verl_ratio in (0.0, 0.25):
        passing = _train(1, **_over_sampled(**{"response/aborted_ratio": verl_ratio}))
        assert check([passing], min_steps=1, aborted_ratio=0.25) == []
    leaked = _train(1, **_over_sampled(**{"response/aborted_ratio": 0.5}))
    assert any("response/aborted_ratio" in e for e in check([leaked], min_steps=1, aborted_ratio=0.25))
    wrong = _train(1, **_over_sampled(**{"rollout/aborted_ratio": 0.5}))
    assert any("rollout/aborted_ratio" in e for e in check([wrong], min_steps=1, aborted_ratio=0.25))
    for key in OVER_SAMPLE_KEYS:
        missing = {k: v for k, v in _train(1, **_over_sampled()).items() if k != key}
        assert any(f"{key} missing" in e for e in check([missing], min_steps=1, aborted_ratio=0.25)), key
    failed = _train(1, **_over_sampled(**{"rollout/failed_rows": 1}))
    assert any("rollout/failed_rows" in e for e in check([failed], min_steps=1, aborted_ratio=0.25))


def test_the_checked_keys_are_the_packages_on_both_stacks():
    """The reference list written in check_metrics.py is what both stacks' code emits (``trainer/metrics.py``)."""
    from treetune_verl.trainer.metrics import CARRY_OVER_METRICS, OVER_SAMPLE_METRICS

    assert sorted(OVER_SAMPLE_KEYS) == sorted(OVER_SAMPLE_METRICS)
    assert sorted(CARRY_OVER_KEYS) == sorted(CARRY_OVER_METRICS)


def _v1_carried(step: int, resumed: int, carried: int, dropped: int, tokens_trained: int) -> dict:
    logged = {
        **_over_sampled(**{"rollout/aborted_groups": dropped, "rollout/aborted_ratio": 0.0}),
        **dict.fromkeys(CARRY_OVER_KEYS, 0.0),
        CARRY_OVER + "groups_resumed": resumed,
        CARRY_OVER + "groups_carried": carried,
        CARRY_OVER + "tokens_trained": tokens_trained,
        "rollout_corr/rollout_is_mean": 1.0,
    }
    return _train(step, **logged)


def test_carry_over_checks_on_verl_0_9_1s_replay_buffer():
    """Groups carried while running: 1 of 4 carried or dropped each step; a step resumes at most what the previous
    one carried; some tokens of earlier weights are trained."""
    steps = [_v1_carried(1, 0, 1, 0, 0), _v1_carried(2, 1, 0, 1, 128), _v1_carried(3, 0, 1, 0, 0)]
    options = {"min_steps": 3, "carry_over": True, "aborted_ratio": 0.25}
    assert check(steps, **options) == []
    resumed_more = [steps[0], _v1_carried(2, 2, 1, 0, 128), steps[2]]  # 2 resumed, 1 carried before
    assert any("groups_resumed" in e for e in check(resumed_more, **options))
    never = [_v1_carried(step, 0, 1, 0, 0) for step in (1, 2, 3)]
    assert "no token of an earlier step's weights was trained in any step" in check(never, **options)
    wrong_share = [steps[0], _v1_carried(2, 1, 1, 1, 128), steps[2]]  # 2 of 5 groups left
    assert any("0.4 of the groups carried or dropped, not 0.25" in e for e in check(wrong_share, **options))
