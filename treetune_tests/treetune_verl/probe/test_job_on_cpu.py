# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The main job, ``python -m treetune_verl.probe``, end to end on a tiny model, and its Hydra overrides."""

from __future__ import annotations

import json
import logging
import math
import runpy
import string
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from treetune_verl.probe.config import CONFIG_DIR, CONFIG_NAME, resolve_config


@pytest.fixture
def char_llama_dir(tmp_path):
    """A character-level tokenizer (no chat template) and a 1-layer Llama over its 73 tokens, saved as an HF folder."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for char in string.digits + string.ascii_letters + " ?+=.,!\n":
        vocab[char] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        initializer_range=0.3,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=1,
    )
    model_dir = tmp_path / "tiny-char-llama"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


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
    assert results["preconditioner"] == "adam" and results["params_without_state"] == 0
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
    assert "estimator.baseline.mode must be one of ['none', 'residual_mu'], got 'regression'" in capsys.readouterr().err


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
