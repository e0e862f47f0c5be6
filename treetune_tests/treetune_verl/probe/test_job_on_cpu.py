# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main job, ``python -m treetune_verl.probe``, end to end on a tiny model, and its Hydra overrides."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import runpy
import statistics
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from treetune_verl.probe.config import CONFIG_DIR, CONFIG_NAME, resolve_config
from treetune_verl.probe.job import run_probe_job


@pytest.fixture
def clean_hydra():
    """Fresh Hydra state; the root logger's handlers and level restored (Hydra configures logging in-process)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    GlobalHydra.instance().clear()
    yield
    GlobalHydra.instance().clear()
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def _run_main(monkeypatch, overrides: list[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["treetune_verl.probe", *overrides])
    runpy.run_module("treetune_verl.probe", run_name="__main__", alter_sys=False)


@pytest.mark.parametrize(
    "model_fixture", ["char_llama_dir", "tiny_model_dir"], ids=["llama-raw-prompt", "qwen2-chatml"]
)
def test_main_job_runs_end_to_end_with_overrides(model_fixture, request, tmp_path, monkeypatch, clean_hydra, capsys):
    """``char_llama_dir``: no chat template (raw prompt path); ``tiny_model_dir`` (shared fixture): ChatML template."""
    model_dir = request.getfixturevalue(model_fixture)
    out_dir = tmp_path / "out"
    _run_main(
        monkeypatch,
        [
            f"model.path={model_dir}",
            "model.device=cpu",
            f"run.output_dir={out_dir}",
            "run.repeats=2",
            "run.progress=false",
            "batch.B_E=3",
            "batch.B_U=2",
            "batch.G=3",
            "probe.mb_size_prompts=1",
            "generation.max_new_tokens=3",
            "optimizer.name=adam",
            "optimizer.state_warmup_batches=1",
            "optimizer.lr=1e-4",
        ],
    )
    results = json.loads((out_dir / "probe_results.json").read_text())
    assert results["config"]["batch"] == {"B_E": 3, "B_U": 2, "G": 3}
    assert results["config"]["probe"]["mb_size_prompts"] == 1
    assert results["preconditioner"] == "optimizer" and results["params_without_state"] == 0
    assert len(results["per_repeat"]) == 2
    for name in ("naive", "rb_residual"):
        entry = results["estimators"][name]
        assert entry["units"] == "nats per L_max token"
        assert math.isfinite(entry["deltaH1"]["mean"]) and math.isfinite(entry["deltaH_true"]["mean"])
    assert len(results["ground_truth"]["deltaH_true"]) == 2
    assert math.isfinite(results["cui_covariance_deltaH"][0])
    assert set(results["timing_median_s"]) >= {"sample_s", "Y_s", "ground_truth_s", "X_s[naive]", "X_s[rb_residual]"}
    printed = capsys.readouterr().out
    assert "probe_results.json" in printed


def test_main_job_rejects_an_unknown_value_naming_the_key(char_llama_dir, monkeypatch, clean_hydra, capsys):
    with pytest.raises(SystemExit) as info:  # Hydra prints the task's exception and exits 1
        _run_main(monkeypatch, [f"model.path={char_llama_dir}", "estimator.baseline.mode=regression"])
    assert info.value.code == 1
    assert (
        "estimator.baseline.mode must be one of ['none', 'residual_mu', 'loo'], got 'regression'"
        in capsys.readouterr().err
    )


def test_hydra_overrides_compose_onto_the_packaged_defaults(clean_hydra):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(
            config_name=CONFIG_NAME,
            overrides=["batch.B_E=8", "probe.mb_size_prompts=1", "estimator.x_estimator_mode=naive", "run.repeats=5"],
        )
        with pytest.raises(Exception, match="no_such_key"):
            compose(config_name=CONFIG_NAME, overrides=["probe.no_such_key=1"])
    resolved = resolve_config(cfg)
    assert resolved.batch.B_E == 8 and resolved.probe.mb_size_prompts == 1 and resolved.run.repeats == 5
    assert resolved.estimator.x_estimator_mode == "naive"
    assert resolved.estimator.baseline.mode == "residual_mu"  # untouched defaults survive


def _small_job(model_dir, out_dir, **overrides) -> dict:
    config = {
        "model": {"path": str(model_dir), "device": "cpu"},
        "batch": {"B_E": 2, "B_U": 2, "G": 3},
        "generation": {"max_new_tokens": 3},
        "run": {"repeats": 2, "progress": False, "output_dir": str(out_dir)},
        "optimizer": {"lr": 1e-3},
    }
    for section, values in overrides.items():
        config[section] = {**config.get(section, {}), **values}
    return run_probe_job(config)


def test_the_default_optimizer_is_verls_actor_optimizer():
    """Reference: verl's own packaged trainer config (``actor_rollout_ref.actor.optim``), read from the installed
    verl, not from our YAML; eps is torch.optim.AdamW's default, which verl does not override."""
    verl_dir = Path(importlib.util.find_spec("verl").origin).parent
    verl_optim = OmegaConf.load(verl_dir / "trainer/config/_generated_ppo_trainer.yaml").actor_rollout_ref.actor.optim
    assert (verl_optim.optimizer_impl, verl_optim.optimizer) == ("torch.optim", "AdamW")
    ours = resolve_config({}).optimizer
    assert ours.name == "adamw"
    assert float(ours.lr) == float(verl_optim.lr)
    assert list(ours.betas) == list(verl_optim.betas)
    assert float(ours.weight_decay) == float(verl_optim.weight_decay)
    assert float(ours.eps) == torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).defaults["eps"]
    assert ours.state_warmup_batches >= 1  # "its state as after a few real steps"


def test_main_job_resamples_U_and_reports_deltaH_true_in_each_estimators_units(char_llama_dir, tmp_path):
    """resample_U: one step per repeat, each measured on its own E; per-sequence RB gets the per-sequence truth."""
    results = _small_job(
        char_llama_dir,
        tmp_path,
        run={"resample_U": True},
        estimator={"rb_normalize_by_length": False},
    )
    # the default optimizer, its state warmed up by optimizer.state_warmup_batches real steps
    assert results["optimizer"] == "AdamW" and results["params_without_state"] == 0
    assert results["optimizer_state_step"] == resolve_config({}).optimizer.state_warmup_batches
    for entry in results["estimators"].values():
        diff = entry["deltaH1_minus_true"]
        assert diff["agrees"] == (abs(diff["mean"]) <= 2 * diff["sem"])
    truth = results["ground_truth"]
    assert set(truth) == {"deltaH_true", "deltaH_true_per_sequence", "H_before", "H_after", "min_ess"}
    assert all(len(values) == 2 for values in truth.values())
    assert len(results["cui_covariance_deltaH"]) == 2
    naive, rb = results["estimators"]["naive"], results["estimators"]["rb_residual"]
    assert naive["units"] == "nats per L_max token" and rb["units"] == "nats per sequence"
    assert naive["deltaH_true"]["mean"] == statistics.fmean(truth["deltaH_true"])
    assert rb["deltaH_true"]["mean"] == statistics.fmean(truth["deltaH_true_per_sequence"])
    for name in ("naive", "rb_residual"):
        per_repeat = [row[name]["deltaH1"] for row in results["per_repeat"]]
        assert results["estimators"][name]["deltaH1"]["mean"] == statistics.fmean(per_repeat)
        assert all(row[name]["deltaH1"] == 1e-3 * row[name]["bars_dot"] for row in results["per_repeat"])


def test_main_job_without_ground_truth_reports_no_deltaH_true(char_llama_dir, tmp_path):
    results = _small_job(char_llama_dir, tmp_path, ground_truth={"enable": False})
    assert results["ground_truth"] == {}
    assert all("deltaH_true" not in entry for entry in results["estimators"].values())
    assert "ground_truth_s" not in results["timing_median_s"]
    assert json.loads((tmp_path / "probe_results.json").read_text())["per_repeat"] == results["per_repeat"]
