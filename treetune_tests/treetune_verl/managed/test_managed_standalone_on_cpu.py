# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``entropy_managed_agent`` in our real agent-loop workers behind our real server on a CPU sglang Engine.

As the middle test (``agent_loop/test_entropy_manager_standalone_on_cpu.py``) runs it: ``EntropyAgentLoopManager``
in verl's standalone mode on a Ray cluster of our own, ``EntropySGLangHttpServer`` launching a real Engine, the tiny
model with short turns. The agent (``agents.two_turn_agent``) answers, gets a user follow-up, answers again. Checked:
``rollout_entropy`` is non-zero exactly at ``response_mask`` and equals a teacher-forced HF recomputation there
within 1e-4 nats; ``rollout_log_probs`` agree with it; the follow-up's tokens are masked; nothing is left running.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import open_dict

from treetune_tests.treetune_verl.agent_loop.fakes import make_batch, unpadded
from treetune_tests.treetune_verl.agent_loop.standalone import (
    driver_state_restored,  # noqa: F401  (fixture, used below)
    model_with_short_turns,
    ray_session,
    standalone_config,
    teacher_forced,
)
from treetune_verl.agent_loop import ROLLOUT_ENTROPY_KEY, EntropyAgentLoopManager
from treetune_verl.config import CONFIG_DIR

pytest.importorskip("uvicorn", reason="sglang's http_server (imported by verl's server) needs uvicorn")
pytest.importorskip("multipart", reason="sglang's http_server needs python-multipart")
pytestmark = pytest.mark.usefixtures("driver_state_restored")
ATOL = 1e-4  # nats


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_managed_loop_behind_real_server_matches_hf(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    model_path = model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    config = standalone_config(model_path, tmp_path / "cfg")
    with open_dict(config):
        config.actor_rollout_ref.rollout.agent.agent_loop_config_path = str(CONFIG_DIR / "managed_agent_loops.yaml")
        config.actor_rollout_ref.rollout.custom["managed"] = {
            "agent_fn": "treetune_tests.treetune_verl.managed.agents:two_turn_agent"
        }
    with ray_session(monkeypatch) as session:
        manager = EntropyAgentLoopManager.create(config)
        [replica] = manager.rollout_replicas
        session.track(*replica.workers, *replica.servers, *manager.agent_loop_workers)
        out = manager.generate_sequences(make_batch(["text"] * 2, ["entropy_managed_agent"] * 2))
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    hf = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    assert out.non_tensor_batch["__num_turns__"].tolist() == [4, 4]
    for i in range(2):
        prompt, response, mask, row = unpadded(out, i)
        n, model_tokens = len(response), mask.bool()
        assert torch.equal(row != 0, model_tokens), f"row {i}: entropy must be non-zero exactly at model tokens"
        assert int((mask[1:n] != mask[: n - 1]).sum()) >= 2, f"row {i}: model / masked follow-up / model, {mask}"
        entropy, token_logp = teacher_forced(hf, prompt, response)
        error = (row[:n].double() - entropy)[model_tokens[:n]].abs().max().item()
        assert error <= ATOL, f"row {i}: rollout_entropy differs from HF by {error:.3g} nats"
        logprob_error = (out.batch["rollout_log_probs"][i, :n].double() - token_logp)[model_tokens[:n]].abs().max()
        assert logprob_error <= 1e-3, f"row {i}: rollout_log_probs differ from HF by {logprob_error:.3g}"
        print(f"row {i}: {n} response tokens, {int(model_tokens.sum())} model tokens, |entropy - HF| {error:.2e}")
    assert out.batch[ROLLOUT_ENTROPY_KEY].dtype == torch.float32
