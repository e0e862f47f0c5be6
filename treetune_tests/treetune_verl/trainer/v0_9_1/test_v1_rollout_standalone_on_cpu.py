# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The middle test on the current stack: verl 0.9.1's rollout path with our block, on real Ray and a real sglang 0.5.12
CPU Engine, rows read back as the V1 trainer reads them.

verl 0.9.1's ``LLMServerManager.create(config)`` with no worker group is its standalone mode (``init_standalone``: a
placement group of its own, our ``EntropySGLangReplica`` chosen by the block in ``LLMServerManager.__init__``, which
the actor entry point imported here wraps, launching ``EntropySGLangHttpServer`` with a real Engine). The block's
manager (``EntropyAgentLoopManager``: verl's ``AgentLoopManagerTQ``) starts two ``AgentLoopWorkerTQ`` actors, which run
our loops through verl's ``LLMServerClient`` and put every row into TransferQueue; the test reads them back with the
V1 seam's own reader (``trainer_seams.read_rollout_entropy``: ``rollout_entropy`` / ``has_rollout_entropy`` from each
row's ``extra_fields``). Nothing of the rollout path is a stand-in; the CPU needs only configuration (a declared GPU,
the CPU engine settings; ``standalone.py``) and none of the CPU runtime patches.

The tool loop goes model / tool / model / tool / model: the test's tool parser asks for ``add(2, 3)`` after every
model turn (``current_stack_fakes.py``), so each tool response goes through verl's Continuous Token context merge.

Checked: each entropy row equals an independent teacher-forced HF recomputation (``torch.log_softmax`` in float64,
``standalone.teacher_forced``) at every ``response_mask`` position within 1e-4 nats and is 0.0 elsewhere, while the
row misaligned by one position either way, or all zeros, would fail; verl's ``rollout_log_probs`` agree with the
recomputation's log-probability of each sampled token; ``has_rollout_entropy`` is False exactly for the stock
``single_turn_agent`` row; nothing of the run is left after ``ray.shutdown()``.
"""

from __future__ import annotations

import importlib.metadata
import time
import uuid

import numpy as np
import pytest
import torch
import yaml
from omegaconf import open_dict

from treetune_tests.treetune_verl.agent_loop.standalone import (
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    check_entropy_row,
    driver_state_restored,  # noqa: F401  (fixture, used below)
    model_with_short_turns,
    ray_session,
    teacher_forced,
)
from treetune_tests.treetune_verl.verl_config import compose_ppo_trainer
from treetune_verl.batch_keys import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.sglang.engine import CPU_ENGINE_KWARGS

pytestmark = [
    pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)"),
    pytest.mark.usefixtures("driver_state_restored"),
]

ATOL = 1e-4  # nats
NAMES = ["entropy_single_turn_agent", "entropy_tool_agent_calls", "single_turn_agent", "entropy_tool_agent_calls"]
WAIT_S = 600


def _config(model_path, workdir):
    from treetune_tests.treetune_verl.agent_loop.tool_fakes import TOOL_CONFIG
    from treetune_tests.treetune_verl.trainer.v0_9_1.current_stack_fakes import ALWAYS_ADD, TOOL_CALLING_LOOP

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tools.yaml").write_text(yaml.safe_dump(TOOL_CONFIG))
    (workdir / "loops.yaml").write_text(yaml.safe_dump([TOOL_CALLING_LOOP]))
    config = compose_ppo_trainer(
        model_path,
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        [
            "actor_rollout_ref.model.external_lib=treetune_verl.trainer.actor_setup",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={workdir / 'tools.yaml'}",
            f"actor_rollout_ref.rollout.multi_turn.format={ALWAYS_ADD}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={workdir / 'loops.yaml'}",
            "actor_rollout_ref.rollout.agent.num_workers=2",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.n=1",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
            # verl 0.7.1's server switched a standalone rollout from dummy to real weights itself
            # (async_sglang_server.py:110); verl 0.9.1's serves rollout.load_format as given (dummy by default)
            "actor_rollout_ref.rollout.load_format=auto",
            "+actor_rollout_ref.rollout.engine_kwargs.sglang.disable_piecewise_cuda_graph=True",
        ],
    )
    with open_dict(config):
        config.actor_rollout_ref.rollout.engine_kwargs.sglang.update(
            {**CPU_ENGINE_KWARGS, "enable_memory_saver": False, "random_seed": 0}
        )
    return config


def _prompts(names: list[str]):
    from verl.utils import tensordict_utils as tu

    n = len(names)
    raw_prompt = np.empty(n, dtype=object)
    raw_prompt[:] = [[{"role": "user", "content": f"plan {i}: add two numbers"}] for i in range(n)]
    batch = tu.get_tensordict(
        {
            "raw_prompt": raw_prompt,
            "agent_name": np.array(names, dtype=object),
            "index": np.arange(n),
            "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
            "uid": np.array([str(uuid.uuid4()) for _ in range(n)], dtype=object),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    return batch


def _wait_for_rows(tq, uids: list[str]) -> dict[str, dict]:
    """Each prompt's row key -> tags, once every prompt is finished (the agent-loop workers put them)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        listed = tq.kv_list(partition_id="train").get("train", {})
        if all(listed.get(uid, {}).get("status") in ("finished", "failure") for uid in uids):
            assert all(listed[uid]["status"] == "finished" for uid in uids), {uid: listed[uid] for uid in uids}
            return {key: tags for key, tags in listed.items() if key not in uids}
        time.sleep(1)
    raise AssertionError(f"rows not in TransferQueue after {WAIT_S} s")


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_v1_rollout_real_engine_matches_hf(tiny_model_dir, tmp_path, monkeypatch):
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from transformers import AutoModelForCausalLM
    from verl.workers.rollout.llm_server import LLMServerManager

    import treetune_verl.trainer.actor_setup  # noqa: F401  (external_lib: what verl imports in the trainer's process)
    from treetune_verl.agent_loop import EntropyAgentLoopManager
    from treetune_verl.trainer.v0_9_1.trainer_seams import read_rollout_entropy

    model_path = model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    config = _config(model_path, tmp_path / "cfg")
    monkeypatch.setenv("TRANSFER_QUEUE_ENABLE", "1")
    with ray_session(monkeypatch) as session:
        tq.init(config.transfer_queue)
        try:
            servers = LLMServerManager.create(config=config)
            [replica] = servers.get_replicas()
            assert type(replica).__name__ == "EntropySGLangReplica" and replica.rollout_mode.value == "standalone"
            manager = EntropyAgentLoopManager.create(
                config=config, llm_client=servers.get_client(), teacher_client=None, reward_loop_worker_handles=None
            )
            session.track(*replica.workers, *replica.servers, *manager.agent_loop_workers)
            prompts = _prompts(NAMES)
            uids = list(prompts["uid"])
            tags = [{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in uids]
            tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
            manager.generate_sequences(prompts)
            rows = _wait_for_rows(tq, uids)
            keys = [f"{uid}_0_0" for uid in uids]  # one session (n=1), one output each
            assert sorted(rows) == sorted(keys), sorted(rows)
            batch = KVBatchMeta(keys=keys, tags=[rows[key] for key in keys], partition_id="train")
            built, masks = read_rollout_entropy(batch)
            data = tq.kv_batch_get(
                keys=keys, partition_id="train", select_fields=["prompts", "responses", "rollout_log_probs"]
            )
            prompts_ids = [p.tolist() for p in data["prompts"].unbind(0)]
            responses = [r.tolist() for r in data["responses"].unbind(0)]
            log_probs = list(data["rollout_log_probs"].unbind(0))
        finally:
            tq.close()
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    assert [bool(row[HAS_ROLLOUT_ENTROPY_KEY]) for row in built] == [name.startswith("entropy_") for name in NAMES]
    hf = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    for i, name in enumerate(NAMES):
        got, mask = built[i][ROLLOUT_ENTROPY_KEY].double(), masks[i].bool()
        assert got.shape == mask.shape == (len(responses[i]),) and mask.any(), f"row {i}: no model-generated token"
        if not name.startswith("entropy_"):
            assert not got.any(), f"row {i} ({name}, stock loop) must be all zeros"
            continue
        expected, token_logp = teacher_forced(hf, prompts_ids[i], responses[i])
        error, late, early, zeros = check_entropy_row(f"row {i} ({name})", got, expected, mask, ATOL)
        logprob_error = (log_probs[i].double() - token_logp)[mask].abs().max()
        assert logprob_error <= 1e-3, f"row {i}: rollout_log_probs differ from HF by {logprob_error:.3g}"
        print(
            f"row {i} {name}: {len(responses[i])} response tokens, {int(mask.sum())} model tokens, |entropy - HF| "
            f"{error:.2e} (late / early / zeros: {late:.2f} / {early:.2f} / {zeros:.2f}), |logprob - HF| "
            f"{logprob_error:.2e}"
        )
    # the tool rows went model / tool / model / ...: tool tokens carry 0.0 (checked above)
    for i in (1, 3):
        runs = int((masks[i][1:] != masks[i][:-1]).sum())
        assert runs >= 2, masks[i]
