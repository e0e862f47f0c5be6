# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy_managed_agent`` in our real agent-loop workers behind our real server on a CPU sglang Engine.

As the middle test (``agent_loop/test_entropy_manager_standalone_on_cpu.py``) runs it: ``EntropyAgentLoopManager``
in verl's standalone mode on a Ray cluster of our own, ``EntropySGLangHttpServer`` launching a real Engine, the tiny
model with short turns, plus one real verl ``RewardLoopWorker`` whose reward function (``rewards.counted_score``)
records every call. Managed sessions of two rows each, with the agent's own reward: two prompts, ``rollout.n=4``,
``rows_per_session=2``: each prompt's 4 rows are 2 sessions of ``agents.branching_agent`` (a first turn, a user
follow-up, two branches of the answer to it: model / masked user tokens / model in every row).

Checked, for the agent-scored batch: 8 rows, 2 groups of 4 (row for row with the input, as verl's trainer unions
them); each row's ``rm_scores`` is its agent's score at its last response token and 0 elsewhere; the reward function
was not called; a session's two rows share every token before their branch; ``rollout_entropy`` and
``rollout_log_probs`` within 1e-4 of a teacher-forced HF recomputation at model tokens (nats) and 0 elsewhere, the
follow-up's tokens masked; the step's ``managed/*`` metrics; nothing left running after ``ray.shutdown()``. For the
same branches unscored (``unscored_branching_agent``): verl's reward function scores each of the 8 rows, as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import ray
import torch
import yaml
from omegaconf import open_dict

from treetune_tests.treetune_verl.agent_loop.fakes import last_token_scores, make_batch, unpadded
from treetune_tests.treetune_verl.agent_loop.standalone import (
    driver_state_restored,  # noqa: F401  (fixture, used below)
    last_turn_start,
    model_with_short_turns,
    ray_session,
    standalone_config,
    teacher_forced,
)
from treetune_tests.treetune_verl.managed import rewards
from treetune_tests.treetune_verl.managed.agents import branch_score
from treetune_verl.agent_loop import ROLLOUT_ENTROPY_KEY
from treetune_verl.batch_keys import PENDING_METRICS_KEY
from treetune_verl.verl import EntropyAgentLoopManager

pytest.importorskip("uvicorn", reason="sglang's http_server (imported by verl's server) needs uvicorn")
pytest.importorskip("multipart", reason="sglang's http_server needs python-multipart")
pytestmark = pytest.mark.usefixtures("driver_state_restored")
ATOL = 1e-4  # nats
N, ROWS_PER_SESSION, PROMPTS = 4, 2, 2  # the managed-rows test: rollout.n, rows per session, prompts
LOOP = "treetune_verl.managed.agent_loop.ManagedAgentLoop"
AGENTS = "treetune_tests.treetune_verl.managed.agents"


def _loops_yaml(path: Path) -> Path:
    """Two managed loops, one per agent (the agent named in each loop's entry)."""
    entries = [
        {"name": "managed_scored", "_target_": LOOP, "agent_fn": f"{AGENTS}:branching_agent"},
        {"name": "managed_unscored", "_target_": LOOP, "agent_fn": f"{AGENTS}:unscored_branching_agent"},
    ]
    path.write_text(yaml.safe_dump(entries))
    return path


def _batch(loop: str):
    """What verl's trainer hands the rollout: each prompt ``N`` times in a row, one uid, and the reward fields."""
    batch = make_batch(["text"] * PROMPTS, [loop] * PROMPTS)
    batch.non_tensor_batch["uid"] = np.array([f"uid-{i}" for i in range(PROMPTS)], dtype=object)
    batch.non_tensor_batch["data_source"] = np.array(["managed"] * PROMPTS, dtype=object)
    batch.non_tensor_batch["reward_model"] = np.array([{"ground_truth": "-"}] * PROMPTS, dtype=object)
    return batch.repeat(repeat_times=N, interleave=True)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_two_scored_branches_per_session_train_as_rows_of_their_group(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    model_path = model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    calls_file = tmp_path / "reward_calls.txt"
    calls_file.touch()
    config = standalone_config(model_path, tmp_path / "cfg")
    with open_dict(config):
        rollout = config.actor_rollout_ref.rollout
        rollout.n = N
        rollout.agent.agent_loop_config_path = str(_loops_yaml(tmp_path / "loops.yaml"))
        rollout.custom["managed"] = {"rows_per_session": ROWS_PER_SESSION}
        config.reward.custom_reward_function.path = rewards.__file__
        config.reward.custom_reward_function.name = "counted_score"
        config.reward.custom_reward_function.reward_kwargs = {"calls_file": str(calls_file)}
    with ray_session(monkeypatch) as session:
        # verl's own reward worker, as its RewardLoopManager starts them (one, taking no CPU slot of ours)
        reward_worker = ray.remote(RewardLoopWorker).options(num_cpus=0).remote(config)
        manager = EntropyAgentLoopManager.create(config, reward_loop_worker_handles=[reward_worker])
        [replica] = manager.rollout_replicas
        session.track(*replica.workers, *replica.servers, *manager.agent_loop_workers, reward_worker)
        scored = manager.generate_sequences(_batch("managed_scored"))
        calls_after_scored = calls_file.read_text().splitlines()
        unscored = manager.generate_sequences(_batch("managed_unscored"))
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    # agent-scored: each row its own score at its last token, verl's reward function never called
    assert len(scored) == PROMPTS * N
    # row for row with the input (verl's trainer unions them): rows 4p..4p+3 are prompt p's group, its uid
    expected = [branch_score(p, b) for p in range(PROMPTS) for _ in range(N // ROWS_PER_SESSION) for b in range(2)]
    assert last_token_scores(scored) == pytest.approx(expected)
    assert calls_after_scored == []
    assert scored.non_tensor_batch["branch"].tolist() == [0.0, 1.0] * (PROMPTS * N // 2)
    assert scored.non_tensor_batch["__num_turns__"].tolist() == [4] * (PROMPTS * N)  # user, model, user, model
    metrics = scored.meta_info[PENDING_METRICS_KEY]
    assert metrics["managed/rows_per_session/mean"] == 2 and metrics["managed/branches_per_session/mean"] == 2
    assert metrics["managed/agent_scored_ratio"] == 1 and metrics["managed/turns_per_row/mean"] == 2
    assert metrics["managed/agent_reward/mean"] == pytest.approx(np.mean(expected))

    # unscored: verl's reward function scores every row, as without managed rows
    assert last_token_scores(unscored) == [rewards.COUNTED_SCORE] * (PROMPTS * N)
    assert len(calls_file.read_text().splitlines()) == PROMPTS * N
    assert unscored.meta_info[PENDING_METRICS_KEY]["managed/agent_scored_ratio"] == 0

    hf = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    worst = 0.0
    for out in (scored, unscored):
        for i in range(len(out)):
            prompt, response, mask, row = unpadded(out, i)
            n, model_tokens = len(response), mask.bool()
            assert torch.equal(row != 0, model_tokens), f"row {i}: entropy must be non-zero exactly at model tokens"
            entropy, token_logp = teacher_forced(hf, prompt, response)
            error = (row[:n].double() - entropy)[model_tokens[:n]].abs().max().item()
            assert error <= ATOL, f"row {i}: rollout_entropy differs from HF by {error:.3g} nats"
            logprobs = out.batch["rollout_log_probs"][i]
            logprob_error = (logprobs[:n].double() - token_logp)[model_tokens[:n]].abs().max().item()
            assert logprob_error <= ATOL, f"row {i}: rollout_log_probs differ from HF by {logprob_error:.3g}"
            assert not logprobs[~model_tokens].any(), f"row {i}: a log-prob where the model wrote no token"
            worst = max(worst, error, logprob_error)
        for first in range(0, len(out), 2):  # a session's rows: one prompt, identical tokens up to the branch
            (prompt_a, response_a, mask_a, _), (prompt_b, response_b, mask_b, _) = (
                unpadded(out, first),
                unpadded(out, first + 1),
            )
            start = last_turn_start(mask_a)
            assert prompt_a == prompt_b and start == last_turn_start(mask_b)
            assert response_a[:start] == response_b[:start]
    print(f"{len(scored) + len(unscored)} rows; largest |rollout entropy or log-prob - HF| {worst:.2e}")
    assert scored.batch[ROLLOUT_ENTROPY_KEY].dtype == torch.float32
