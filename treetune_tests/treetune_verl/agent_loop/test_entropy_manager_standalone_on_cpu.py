# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The middle test: our manager in verl 0.7.1's standalone rollout mode, on real Ray, with a real sglang CPU Engine.

``EntropyAgentLoopManager.create(config)`` with no worker group is verl's standalone mode
(``AgentLoopManager._initialize_llm_servers`` -> ``RolloutReplica.init_standalone``, ``verl/workers/rollout/
replica.py``): a new placement group, a ``RayWorkerGroup`` of verl's ``CheckpointEngineWorker`` on it, then our
``EntropySGLangReplica.launch_servers`` starting ``EntropySGLangHttpServer`` as a Ray actor, which launches a real
sglang Engine (scheduler + detokenizer processes, uvicorn). ``manager.generate_sequences`` then sends the rows
through verl's ``GlobalRequestLoadBalancer`` and two ``EntropyAgentLoopWorker`` actors (``AsyncLLMServerManager``
-> ``server.generate.remote``) and concatenates their outputs. Nothing of the rollout path is a stand-in.

What makes that run on a machine without a GPU (configuration only; no patch of verl, sglang or our code):
  - ``ray.init(num_gpus=1)``: a declared, not real, GPU. ``init_standalone`` builds a ``ResourcePoolManager``
    whose ``_check_resource_available`` counts Ray's ``GPU`` resource (without it: ``ValueError: Total available GPUs
    0 is less than total desired GPUs 1``) and a placement-group bundle ``{"CPU": 3, "GPU": 1}``
    (``RayResourcePool(use_gpu=True)``, ``device_name="cuda"``). The ``CheckpointEngineWorker`` gets
    ``num_gpus=1/3``, so Ray sets its ``CUDA_VISIBLE_DEVICES=0``, which ``SGLangReplica.launch_servers`` reads and
    hands to the server actor. torch still sees no CUDA anywhere. (No custom ``cpu`` resource is needed: that one
    is for the trainer's ``trainer.device=cpu`` bundles, not for the rollout pool.)
  - the project's CPU engine settings through ``rollout.engine_kwargs.sglang`` (verl spreads them last) and
    ``enable_memory_saver=False`` (torch_memory_saver is CUDA-only).
  - none of the CPU runtime patches of ``tools/cpu_shims/verl_cpu`` (FSDP actor, trainer-side ``ServerArgs``, weight
    sync): ``TREETUNE_VERL_CPU_PATCHES=0`` in every Ray process shows the standalone path needs none of them.

The model is a copy of the tiny random Qwen2 whose ``eos_token_id`` lists 1 in 8 token ids (weights unchanged), so
that a random model ends its turns after a few tokens and the tool loop reaches its interaction turns (model / user /
model / user, user tokens masked out) instead of spending the whole response on its first turn.

Checked: ``rollout_entropy`` float32 ``[B, response_length]`` equals an independent teacher-forced HF recomputation
(``torch.log_softmax`` in float64, written here) at every ``response_mask`` position within 1e-4 nats and is 0.0
elsewhere, while the same row misaligned by one position (either way) or all zeros would fail it; verl's
``rollout_log_probs`` agree with the recomputation's log-probability of each sampled token (token alignment);
``has_rollout_entropy`` is False exactly for the stock ``single_turn_agent`` row; the manager's
``meta_info["timing"]`` carries ``agent_loop/rollout_entropy/{mean,p50,p90,max,rows_without_entropy}``; the
scheduler holds no entropy state afterwards (sglang's ``/server_info``); after ``ray.shutdown()`` none of the
processes the run started (Ray's own, the worker actors, sglang's scheduler and detokenizer) is left.

With the live forecast's block on, the same (training) call also samples the forecast's E on the same server, in the
workers, beside the rows (``forecast/rollout_eval.py``, ``verl/v0_7_1/forecast_eval_worker.py``): not rows of the batch
(its row count is the input's; our columns gone), one entry for each of E's uids (the first ⌈0.5 · 3⌉ = 2 of the
three in sorted order, ``eval_share`` 0.5) with that uid's prompt ids,
``rollout.n`` responses each from requests of E's own (sticky keys unique), each a sample of the model (it ends at its
first end id or at the budget), and its seconds and token share in the step's metrics.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from omegaconf import open_dict

from treetune_tests.treetune_verl.agent_loop.fakes import make_batch, unpadded
from treetune_tests.treetune_verl.agent_loop.standalone import (
    RESPONSE_LENGTH,
    check_entropy_row,
    driver_state_restored,  # noqa: F401  (fixture, used below)
    model_with_short_turns,
    pids_of,
    ray_session,
    server_info,
    standalone_config,
    teacher_forced,
)
from treetune_verl.agent_loop import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY, PENDING_METRICS_KEY
from treetune_verl.forecast.rollout_eval import REQUEST_PREFIX
from treetune_verl.sglang.config import INTERNAL_STATE_KEY
from treetune_verl.verl import EntropyAgentLoopManager

pytest.importorskip("uvicorn", reason="sglang's http_server (imported by verl's server) needs uvicorn")
pytest.importorskip("multipart", reason="sglang's http_server needs python-multipart")
pytestmark = pytest.mark.usefixtures("driver_state_restored")

ATOL = 1e-4  # nats
NAMES = ["entropy_single_turn_agent", "entropy_tool_agent", "single_turn_agent", "entropy_single_turn_agent"]
UIDS = ["u0", "u1", "u2", "u0"]  # rows 0 and 3: one prompt group (E samples it once)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_standalone_manager_real_engine_matches_hf(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    model_path = model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    config = standalone_config(model_path, tmp_path / "cfg")
    with open_dict(config):  # the live forecast's block: E sampled with the training call
        config.actor_rollout_ref.rollout.custom = {"entropy_forecast": {"every": 1}}
        config.actor_rollout_ref.model.external_lib = "treetune_verl.verl.process_setup"
    with ray_session(monkeypatch) as session:
        t0 = time.monotonic()
        manager = EntropyAgentLoopManager.create(config)
        t_create = time.monotonic() - t0
        [replica] = manager.rollout_replicas
        assert type(replica).__name__ == "EntropySGLangReplica" and replica.rollout_mode.value == "standalone"
        assert len(manager.agent_loop_workers) == 2
        session.track(*replica.workers, *replica.servers, *manager.agent_loop_workers)
        server_pids = pids_of(replica.servers[0])
        assert len(server_pids) >= 3, f"server actor + sglang scheduler + detokenizer, got {server_pids}"

        t0 = time.monotonic()
        batch = make_batch(["text"] * len(NAMES), NAMES)
        batch.non_tensor_batch["uid"] = np.array(UIDS, dtype=object)
        out = manager.generate_sequences(batch)
        t_generate = time.monotonic() - t0
        states = server_info(manager.server_addresses[0])["internal_states"]
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"
    print(
        f"ray.init {session.seconds['ray.init']:.1f}s, manager create {t_create:.1f}s, generate_sequences "
        f"{t_generate:.1f}s, ray.shutdown {session.seconds['ray.shutdown']:.1f}s; {len(session.started)} processes "
        "started, none left"
    )

    # the scheduler holds no entropy state once every request has finished
    assert [state[INTERNAL_STATE_KEY] for state in states] == [0]

    entropy = out.batch[ROLLOUT_ENTROPY_KEY]
    assert entropy.shape == (len(NAMES), RESPONSE_LENGTH) and entropy.dtype == torch.float32
    assert out.batch[HAS_ROLLOUT_ENTROPY_KEY].dtype == torch.bool
    assert out.batch[HAS_ROLLOUT_ENTROPY_KEY].tolist() == [name.startswith("entropy_") for name in NAMES]
    assert not any("entropy" in key for key in out.non_tensor_batch), sorted(out.non_tensor_batch)

    hf = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    pooled = []
    for i, name in enumerate(NAMES):
        prompt, response, mask, row = unpadded(out, i)
        n = len(response)
        assert mask[:n].any(), f"row {i}: no model-generated token"
        assert not mask[n:].any() and not row[n:].any(), f"row {i}: padding must carry 0.0"
        if not name.startswith("entropy_"):
            assert not row.any(), f"row {i} ({name}, stock loop) must be all zeros"
            continue
        entropy_n, token_logp = teacher_forced(hf, prompt, response)
        expected = torch.zeros(RESPONSE_LENGTH, dtype=torch.float64)
        expected[:n] = entropy_n
        got, model_tokens = row.double(), mask.bool()
        # also the negative controls: the row misaligned by one position (either way), or all zeros, would fail
        error, late, early, zeros = check_entropy_row(f"row {i} ({name})", got, expected, model_tokens, ATOL)
        # verl's rollout log-probs (sglang's, same tokens) agree with the recomputation: the tokens line up
        logprob_error = (out.batch["rollout_log_probs"][i, :n].double() - token_logp)[model_tokens[:n]].abs().max()
        assert logprob_error <= 1e-3, f"row {i}: rollout_log_probs differ from HF by {logprob_error:.3g}"
        print(
            f"row {i} {name}: {n} response tokens, {int(model_tokens.sum())} model tokens, |entropy - HF| "
            f"{error:.2e} (one late / one early / zeros: {late:.2f} / {early:.2f} / {zeros:.2f}), |logprob - HF| "
            f"{logprob_error:.2e}"
        )
        pooled.append(got[model_tokens])

    # the tool loop went model / user / model / user; user tokens carry 0.0 (checked above)
    tool_mask = unpadded(out, NAMES.index("entropy_tool_agent"))[2]
    assert int((tool_mask[1:] != tool_mask[:-1]).sum()) >= 3, tool_mask
    assert out.non_tensor_batch["__num_turns__"][NAMES.index("entropy_tool_agent")] >= 4

    timing = out.meta_info["timing"]
    pooled = torch.cat(pooled)
    assert timing["agent_loop/rollout_entropy/rows_without_entropy"] == 1
    assert timing["agent_loop/rollout_entropy/mean"] == pytest.approx(pooled.mean().item(), rel=1e-5)
    assert timing["agent_loop/rollout_entropy/max"] == pytest.approx(pooled.max().item(), rel=1e-5)
    assert {f"agent_loop/rollout_entropy/{k}" for k in ("p50", "p90")} <= set(timing)

    check_forecast_eval(out, model_path)


def check_forecast_eval(out, model_path) -> None:
    """The forecast's E beside the batch: its own requests, the batch's prompts, samples of the model."""
    E = out.meta_info[FORECAST_EVAL_META_KEY]
    assert len(out) == len(NAMES)  # E is not in the batch
    assert not any(key.startswith("treetune_forecast") for key in out.non_tensor_batch), sorted(out.non_tensor_batch)
    assert E.uids == ["u0", "u1"] and E.budget == RESPONSE_LENGTH
    for uid, prompt_ids in zip(E.uids, E.prompt_ids, strict=True):
        assert prompt_ids.tolist() == unpadded(out, UIDS.index(uid))[0]
    request_ids = [rid for group in E.request_ids for rid in group]
    assert all(rid.startswith(REQUEST_PREFIX) for rid in request_ids) and len(set(request_ids)) == len(request_ids)
    end_ids = set(json.loads((model_path / "config.json").read_text())["eos_token_id"])
    for group in E.response_ids:
        assert len(group) == 1  # rollout.n
        for response in group:
            assert 0 < len(response) <= RESPONSE_LENGTH
            assert response[-1] in end_ids or len(response) == RESPONSE_LENGTH
            assert not end_ids & set(response[:-1].tolist())  # sampling stopped at the first end id
    pending = out.meta_info[PENDING_METRICS_KEY]
    assert pending["probe/eval_gen_s"] > 0 and 0 < pending["probe/eval_gen_token_share"] < 1
    share = pending["probe/eval_gen_token_share"]
    print(f"E: {len(E.uids)} prompts x 1 in {pending['probe/eval_gen_s']:.2f}s ({share:.0%} of the call's tokens)")
