# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The e2e variants of ``treetune_tests/e2e/test_entropy_e2e.sh`` (``E2E_VARIANT=full`` then ``resume``): verl's
own trainer on CPU (verl 0.7.1's ``RayPPOTrainer``; on the current stack verl 0.9.1's default V1 trainer) with the tiny random Qwen2, two FSDP training processes on gloo (two sglang rollout replicas), a
reference model and the KL loss, validation before training and after every step, a checkpoint at step 1, and a
second run that resumes it and trains step 2. The full run is also each stack's plain check of the block (what
``make e2e`` runs on one process): every step's rollout entropy against the actor's of the same tokens, every row
from our loop, our classes in the log. On both stacks both runs also over-sample with abort
(``over_sample_rate=0.25``: 1 of 4 groups cut at every step; on verl 0.9.1 through our replay buffer) with carry-over
(the cut group resumes at the next step, across the checkpoint: the resumed run trains the group the saved run
carried), shape the advantages by rollout entropy, train on forking tokens and forecast the entropy change of every
update: every feature of the step at once, at 2 ranks with validation, checkpoint and resume (managed sessions of
several rows cannot over-sample: the README's refused pair). These are each stack's GRPO runs of plain over-sampling, forking tokens and the forecast (on
verl 0.7.1 they were a run of their own, ``test_e2e_all_features_on_cpu.py``, until its checks moved here: one
row per actor micro-batch there as here, so that an aborted row, which verl 0.7.1 keeps in its batch as an empty
response, is a micro-batch of its own: the loss fix's hardest case).

The slow test runs both (about 5-7 minutes on 2 shared cores; outputs ``outputs/e2e-test-full/verl-<version>/`` and
``outputs/e2e-test-resume/verl-<version>/``); the script checks the metrics itself (``check_metrics --kl --val``, and for the resume
``--first-step 2 --same-generations``), the test re-reads them. The fast tests compose the variants' arguments.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from treetune_tests.e2e.check_metrics import (
    ENTROPY_MEAN,
    KL_LOSS,
    PEARSON,
    PG_LOSS,
    PROBS_DIFF,
    VAL_ENTROPY_MEAN,
    check,
    is_validation_only,
    read_generations,
    read_steps,
    same_generations,
    training_steps,
    val_core,
)
from treetune_tests.e2e.script import kept_workdir, run_script, run_training
from treetune_verl.config import read_overrides

FULL = kept_workdir("full")
RESUME = kept_workdir("resume")
CURRENT = importlib.metadata.version("verl") == "0.9.1"  # the current stack (verl 0.9.1's V1 trainer)
# What the block adds on each stack (the current stack's server selection needs the actor entry point too).
BLOCK_EXTRA = ["actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup"] if CURRENT else []
# The agent-loop worker class in the log: ours on both stacks (on verl 0.9.1 a subclass of verl's TransferQueue worker,
# verl/v0_9_1/session_rows_worker.py).
WORKER_CLASS = "EntropyAgentLoopWorkerTQ" if CURRENT else "EntropyAgentLoopWorker"
# Both runs also over-sample with abort (1 of the 4 groups aborted at every step: check_metrics --aborted-ratio 0.25),
# shape the advantages by rollout entropy (check_metrics --shaping), train on forking tokens (the top 20 % of tokens by
# rollout entropy carry the policy gradient) and forecast every step
# in the actor, over its 2 ranks (the script checks its probe/* metrics: check_metrics --forecast-every 1).
PG_TOKEN_QUANTILE = 0.2
ABORTED_RATIO = 0.25
SHAPING_ALPHA = 0.4  # and entropy advantage shaping (its bonus before the forking-token mask)
FEATURES_ENV = {
    "E2E_OVER_SAMPLE": str(ABORTED_RATIO),
    "E2E_CARRY_OVER": "1",  # the cut group carried into the next step (check_metrics --carry-over)
    "E2E_PG_TOKEN_QUANTILE": str(PG_TOKEN_QUANTILE),
    "E2E_SHAPING_ALPHA": str(SHAPING_ALPHA),
    "E2E_FORECAST": "1",
}
# verl 0.7.1 keeps an aborted row in its batch (an empty response): one row per micro-batch makes it a micro-batch of
# its own, the loss fix's hardest case. verl 0.9.1's aborted groups never reach its batch.
FEATURES_ARGS = () if CURRENT else ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",)


def _compose(overrides: list[str]):
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def _print_args(variant: str, workdir: Path, model: Path, **env: str) -> list[str]:
    result = run_script(
        {
            "E2E_PRINT_ARGS": "1",
            "E2E_DEVICE": "cpu",
            "E2E_VARIANT": variant,
            "MODEL_PATH": str(model),
            "E2E_WORKDIR": str(workdir),
            **env,
        },
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("variant", ["full", "resume"])
def test_variant_arguments_compose(tiny_model_dir, tmp_path, variant):
    saved = tmp_path / "saved"
    (saved / "checkpoints").mkdir(parents=True)
    (saved / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    args = _print_args(variant, tmp_path / "run", tiny_model_dir, E2E_RESUME_FROM=str(saved))
    keys = [arg.split("=", 1)[0].lstrip("+") for arg in args]
    assert len(keys) == len(set(keys)), "an override given twice"
    block = read_overrides() + BLOCK_EXTRA
    assert args[-len(block) :] == block  # the README block last, nothing after it
    config = _compose(args)
    trainer, actor = config.trainer, config.actor_rollout_ref.actor
    assert trainer.n_gpus_per_node == 2 and config.ray_kwargs.ray_init.num_gpus == 2
    assert config.ray_kwargs.ray_init.num_cpus >= 6
    assert (
        CURRENT or config.ray_kwargs.ray_init.resources.cpu >= 2
    )  # verl 0.7.1's CPU bundles (no custom resource on 0.9.1)
    assert actor.use_kl_loss is True and actor.kl_loss_type == "low_var_kl" and actor.kl_loss_coef == 0.01
    assert config.actor_rollout_ref.ref.fsdp_config.dtype == "float32"
    assert trainer.val_before_train is True and trainer.test_freq == 1
    assert trainer.validation_data_dir == str(tmp_path / "run" / "validation")
    assert trainer.default_local_dir == str(tmp_path / "run" / "checkpoints")
    if variant == "full":
        assert (trainer.total_training_steps, trainer.save_freq, trainer.resume_mode) == (1, 1, "disable")
    else:
        assert (trainer.total_training_steps, trainer.save_freq, trainer.resume_mode) == (2, -1, "auto")


def test_base_variant_keeps_one_process_and_no_extras(tiny_model_dir, tmp_path):
    config = _compose(_print_args("base", tmp_path, tiny_model_dir))
    trainer = config.trainer
    assert trainer.n_gpus_per_node == 1 and config.ray_kwargs.ray_init.num_gpus == 1
    assert config.actor_rollout_ref.actor.use_kl_loss is False
    assert (trainer.val_before_train, trainer.test_freq, trainer.save_freq) == (False, -1, -1)
    assert trainer.resume_mode == "disable" and trainer.total_training_steps == 2


def test_resume_refuses_without_a_saved_run_or_in_place(tiny_model_dir, tmp_path):
    env = {"E2E_PRINT_ARGS": "1", "E2E_DEVICE": "cpu", "E2E_VARIANT": "resume", "MODEL_PATH": str(tiny_model_dir)}
    missing = run_script(
        {**env, "E2E_WORKDIR": str(tmp_path / "a"), "E2E_RESUME_FROM": str(tmp_path / "b")}, timeout=60
    )
    assert missing.returncode == 1 and "needs a saved run" in missing.stderr
    (tmp_path / "a" / "checkpoints").mkdir(parents=True)
    (tmp_path / "a" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    in_place = run_script(
        {**env, "E2E_WORKDIR": str(tmp_path / "a"), "E2E_RESUME_FROM": str(tmp_path / "a")}, timeout=60
    )
    assert in_place.returncode == 2 and "must be another run's workdir" in in_place.stderr
    unknown = run_script({**env, "E2E_VARIANT": "nope"}, timeout=60)
    assert unknown.returncode == 2 and "E2E_VARIANT must be" in unknown.stderr


def _check_forecast(metrics: dict) -> None:
    """The forecast's E sampled by the rollout's servers beside the step's rows, none in the actor: half of the step's
    4 prompts (eval_share 0.5), less a cut group's; the forecast saw the update's one optimizer step, so the update's
    realised change is the first step's."""
    # 2 marked; the E of a group that over-sampling cut is cut with it (or, carried, lands too late for this step)
    assert metrics["probe/sample_s"] == 0 and metrics["probe/eval_prompts"] in (1, 2)
    assert metrics["probe/eval_gen_s"] > 0 and 0 < metrics["probe/eval_gen_token_share"] < 1
    assert metrics["probe/optimizer_steps"] == 1
    assert metrics["probe/deltaH_realised_first_step"] == metrics["probe/deltaH_realised"]
    assert metrics["timing_s/probe"] > 0 and metrics["probe/step_norm"] > 0


def _check_over_sampling(metrics: dict, resumed: int) -> None:
    """1 of the 4 groups not kept, carried into the next step (none dropped: "aborted" is dropped); ``resumed``
    groups carried in and trained, with their 2 rows' tokens of the earlier weights. verl 0.9.1: the carried group
    left running, never in verl's batch (verl's count of empty responses 0; the 6 kept rows padded to 8 by verl itself,
    4 per rank). verl 0.7.1: its rows in the batch as empty responses (verl's count 0.25)."""
    assert metrics["rollout/carry_over/groups_carried"] == 1 and metrics["rollout/aborted_groups"] == 0
    assert metrics["rollout/aborted_rows"] == 0 and metrics["rollout/aborted_ratio"] == 0
    assert metrics["response/aborted_ratio"] == (0 if CURRENT else 0.25)
    assert metrics["rollout/carry_over/groups_resumed"] == resumed
    assert metrics["rollout/carry_over/rows_trained"] == 2 * resumed
    assert (metrics["rollout/carry_over/tokens_trained"] > 0) == bool(resumed)
    assert metrics["rollout/carry_over/prompt_wait_max"] <= metrics["rollout/carry_over/prompt_wait_bound"]


def _run_variant(variant: str, workdir: Path, **env: str) -> subprocess.CompletedProcess:
    env = {"E2E_MODEL": "tiny", "E2E_VARIANT": variant, "E2E_WORKDIR": str(workdir), **FEATURES_ENV, **env}
    return run_training(env, *FEATURES_ARGS, timeout=1200)  # exit 0, nothing of the trainer's session left


@pytest.mark.slow
def test_the_full_variant_runs_every_feature_of_the_step(tiny_model_dir, tmp_path):
    """The features the slow test's runs turn on reach the trainer's config (advantage shaping among them)."""
    args = _print_args("full", tmp_path / "run", tiny_model_dir, **FEATURES_ENV)
    rollout = _compose(args).actor_rollout_ref.rollout
    assert rollout.over_sample_rate == ABORTED_RATIO and rollout.custom.entropy.pg_token_quantile == PG_TOKEN_QUANTILE
    assert rollout.custom.entropy.advantage_shaping.alpha == SHAPING_ALPHA
    assert rollout.custom.over_sample.carry_over is True
    assert rollout.custom.entropy_forecast.every == 1


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant; on a GPU run the script directly")
def test_two_processes_kl_validation_checkpoint_then_resume():
    # Run 1: E2E_VARIANT=full, total_training_steps=1, checkpoint at step 1.
    result = _run_variant("full", FULL)
    assert "OK: 1 step(s)" in result.stdout
    steps = read_steps(FULL / "metrics.jsonl")
    assert [(m["step"], is_validation_only(m)) for m in steps] == [(0, True), (1, False)]
    bounds = {
        "max_entropy_diff": 1e-3,
        "pg_token_quantile": PG_TOKEN_QUANTILE,
        "shaping": True,
        "aborted_ratio": ABORTED_RATIO,
        "carry_over": True,
        "forecast_every": 1,
    }
    assert check(steps, 1, 1e-3, 0.999, first_step=1, kl=True, val=True, **bounds) == []
    saved = steps[1]
    assert saved[KL_LOSS] == pytest.approx(0.0, abs=1e-6)  # the actor starts as the reference model
    # beyond check() (entropy mean > 0 and agreement <= 1e-3 nats, finite loss, grad norm > 0): every row came from
    # the entropy loop, and no token's entropy is far from the actor's (fp32 on both sides)
    assert saved["timing_s/agent_loop/rollout_entropy/rows_without_entropy"] == 0
    assert saved["rollout_entropy/actor_abs_diff/max"] <= 1e-2
    _check_forecast(saved)
    _check_over_sampling(saved, resumed=0)
    assert (FULL / "entropy_forecast.png").read_bytes()[:4] == b"\x89PNG"
    log = (FULL / "train.log").read_text()
    assert "EntropySGLangHttpServer" in log and WORKER_CLASS in log
    assert {int(r) for r in re.findall(r"SGLang http server: .*replica_rank=(\d+)", log)} == {0, 1}
    actor_dir = FULL / "checkpoints" / "global_step_1" / "actor"
    assert sorted(p.name for p in actor_dir.glob("model_world_size_*.pt")) == [
        "model_world_size_2_rank_0.pt",
        "model_world_size_2_rank_1.pt",
    ]
    assert (FULL / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    # the greedy validation changed with the step-1 update, so comparing generations tells weights apart
    assert same_generations(FULL / "validation" / "0.jsonl", FULL / "validation" / "1.jsonl") != []

    # Run 2: E2E_VARIANT=resume from run 1's checkpoint to total_training_steps=2.
    result = _run_variant("resume", RESUME, E2E_RESUME_FROM=str(FULL))
    assert "OK: 1 step(s)" in result.stdout
    steps = read_steps(RESUME / "metrics.jsonl")
    assert [(m["step"], is_validation_only(m)) for m in steps] == [(1, True), (2, False)]
    assert [m["step"] for m in training_steps(steps)] == [2]
    # verl's rollout-vs-actor probabilities include the carried group's tokens of step 1's weights: no bound on them
    # (ours, the entropy agreement, leaves those tokens out and keeps its bound)
    assert check(steps, 1, None, None, first_step=2, kl=True, val=True, **bounds) == []
    before, resumed = steps
    log = (RESUME / "train.log").read_text()
    assert "Resuming from" in log and str(RESUME / "checkpoints" / "global_step_1") in log
    # the loaded weights are the saved ones: the greedy validation before training reproduces run 1's validation
    # after its step-1 update, token for token, so the same rewards; their mean up to the order of the sum (rows come
    # back in another order: 1 ulp seen in CI), the entropy up to float noise (the engine batches the requests
    # differently: 2e-8 measured)
    assert same_generations(FULL / "validation" / "1.jsonl", RESUME / "validation" / "1.jsonl") == []
    assert len(read_generations(RESUME / "validation" / "1.jsonl")) == 4
    assert val_core(before) == pytest.approx(val_core(saved), rel=1e-12, abs=0)
    assert before[VAL_ENTROPY_MEAN] == pytest.approx(saved[VAL_ENTROPY_MEAN], rel=1e-5)
    # and not the initial model (the reference): KL > 0 before any update of this run
    assert resumed[KL_LOSS] > 0
    # the same rollout-entropy metrics as the saved run, a finite loss, the engine serving the loaded weights
    entropy_keys = {k for k in saved if "rollout_entropy" in k}
    assert {k for k in resumed if "rollout_entropy" in k} == entropy_keys and ENTROPY_MEAN in entropy_keys
    assert math.isfinite(resumed[PG_LOSS]) and resumed[ENTROPY_MEAN] > 0
    assert resumed[PROBS_DIFF] > 1e-4 and resumed[PEARSON] < 1  # the older tokens in verl's comparison (0.011, 0.995)
    _check_forecast(resumed)
    _check_over_sampling(resumed, resumed=1)  # the group the saved run carried, restored from its checkpoint
    summary = json.loads((RESUME / "summary.json").read_text())
    assert [row["step"] for row in summary] == [1, 2]
