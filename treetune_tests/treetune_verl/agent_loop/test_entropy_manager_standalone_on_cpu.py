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
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import ray
import torch
from omegaconf import open_dict

from treetune_tests.treetune_verl.agent_loop.fakes import compose_config, make_batch, unpadded
from treetune_verl.agent_loop import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY, EntropyAgentLoopManager
from treetune_verl.sglang.engine import CPU_ENGINE_KWARGS
from treetune_verl.sglang.scheduler_patches import INTERNAL_STATE_KEY

pytest.importorskip("uvicorn", reason="sglang's http_server (imported by verl's server) needs uvicorn")
pytest.importorskip("multipart", reason="sglang's http_server needs python-multipart")

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 128
REPO_ROOT = Path(__file__).resolve().parents[3]
ATOL = 1e-4  # nats
NAMES = ["entropy_single_turn_agent", "entropy_tool_agent", "single_turn_agent", "entropy_single_turn_agent"]
STOP_EVERY = 8  # 1 in STOP_EVERY token ids ends a turn


@pytest.fixture(autouse=True)
def driver_state_restored(monkeypatch):
    """The manager imports our replica in this process, which runs verl's sglang loader (``_load_sglang``: sets
    ``SGLANG_USE_CPU_ENGINE=1``) and verl's ``sglang_rollout`` (replaces sglang's ``engine._set_envs_and_config`` at
    import). Undo both here, so the in-process Engine tests that run later in the session see sglang as shipped."""
    from sglang.srt.entrypoints import engine

    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)  # restored to its current state at teardown
    original = engine._set_envs_and_config
    yield
    engine._set_envs_and_config = original


def _model_with_short_turns(tiny_model_dir: Path, dest: Path) -> Path:
    """A copy of the tiny model whose config lists every STOP_EVERY-th token id as an end-of-sequence id."""
    shutil.copytree(tiny_model_dir, dest)
    config = json.loads((dest / "config.json").read_text())
    stop_ids = sorted({config["eos_token_id"], *range(STOP_EVERY, config["vocab_size"], STOP_EVERY)})
    config["eos_token_id"] = stop_ids
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    generation = dest / "generation_config.json"
    if generation.exists():
        generation.write_text(json.dumps({**json.loads(generation.read_text()), "eos_token_id": stop_ids}, indent=2))
    return dest


@torch.no_grad()
def _teacher_forced(model, prompt: list[int], response: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy (nats) of the next-token distribution at each response position, and log p(response token)."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double()
    logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) + len(response) - 1], dim=-1)  # [len(response), V]
    entropy = -(logp.exp() * logp).sum(dim=-1)
    token_logp = logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
    return entropy, token_logp


def _config(model_path: Path, workdir: Path):
    config = compose_config(
        model_path,
        workdir,
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        extra=[
            "actor_rollout_ref.rollout.agent.num_workers=2",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.n=1",
        ],
    )
    with open_dict(config):
        config.actor_rollout_ref.rollout.engine_kwargs.sglang = {
            **CPU_ENGINE_KWARGS,
            "enable_memory_saver": False,  # torch_memory_saver is CUDA-only
            "random_seed": 0,
        }
    return config


def _descendants(pid: int) -> set[int]:
    return {child.pid for child in psutil.Process(pid).children(recursive=True)}


def _pids_of(handle) -> list[int]:
    """An actor's process and all its descendants (for the server actor: sglang's scheduler and detokenizer)."""

    def pids(_self):
        import psutil

        me = psutil.Process()
        return [me.pid] + [child.pid for child in me.children(recursive=True)]

    return ray.get(handle.__ray_call__.remote(pids))


def _alive(pids: set[int]) -> dict[int, str]:
    left = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                left[pid] = " ".join(process.cmdline())[:120] or process.name()
        except psutil.NoSuchProcess:
            pass
    return left


def _end_leftovers(pids: set[int], grace_s: float = 30.0) -> dict[int, str]:
    """Wait up to ``grace_s`` for ``pids`` (processes this test started) to exit; kill, by pid, what is left.
    Returns what was left (pid -> command line)."""
    deadline = time.monotonic() + grace_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(1)
    left = _alive(pids)
    for pid in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    return left


def _error(row: torch.Tensor, expected: torch.Tensor, model_tokens: torch.Tensor) -> float:
    """Largest |rollout_entropy - recomputation| over model tokens (nats), all ``[response_length]``; inf if a
    position outside ``response_mask`` (user/tool token, padding) is non-zero."""
    if row[~model_tokens].any():
        return float("inf")
    return (row[model_tokens] - expected[model_tokens]).abs().max().item()


def _server_info(address: str) -> dict:
    with urllib.request.urlopen(f"http://{address}/server_info", timeout=30) as reply:
        return json.loads(reply.read())


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_standalone_manager_real_engine_matches_hf(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    model_path = _model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    config = _config(model_path, tmp_path / "cfg")
    env_vars = {
        # Ray's workers import the tool / interaction classes of the test's config (fakes.py).
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        # Not needed on this path (the five CPU patches are for the FSDP actor and the weight sync of the trainer):
        # off, so that the test shows standalone mode needs none of them.
        "TREETUNE_VERL_CPU_PATCHES": "0",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key, value in env_vars.items():
        monkeypatch.setenv(key, value)

    before = _descendants(os.getpid())
    started: set[int] = set()
    t0 = time.monotonic()
    ray.init(
        address="local",  # a cluster of our own, never someone else's
        num_cpus=4,  # logical: the rollout pool's bundle {"CPU": 3, "GPU": 1} plus one for verl's master-port task
        num_gpus=1,  # declared, not real
        include_dashboard=False,
        log_to_driver=True,  # actor output appears in the captured output of a failure
        runtime_env={"env_vars": env_vars},
        # no idle workers started up front: on a 2-core machine they only slow the start
        _system_config={"prestart_worker_first_driver": False},
    )
    t_init = time.monotonic() - t0
    try:
        node = ray._private.worker._global_node
        started |= {info.process.pid for infos in node.all_processes.values() for info in infos}
        t0 = time.monotonic()
        manager = EntropyAgentLoopManager.create(config)
        t_create = time.monotonic() - t0
        [replica] = manager.rollout_replicas
        assert type(replica).__name__ == "EntropySGLangReplica" and replica.rollout_mode.value == "standalone"
        assert len(manager.agent_loop_workers) == 2
        for handle in [*replica.workers, *replica.servers, *manager.agent_loop_workers]:
            started |= set(_pids_of(handle))
        server_pids = _pids_of(replica.servers[0])
        assert len(server_pids) >= 3, f"server actor + sglang scheduler + detokenizer, got {server_pids}"

        t0 = time.monotonic()
        out = manager.generate_sequences(make_batch(["text"] * len(NAMES), NAMES))
        t_generate = time.monotonic() - t0
        states = _server_info(manager.server_addresses[0])["internal_states"]
    finally:
        started |= _descendants(os.getpid()) - before  # Ray's GCS, raylet, workers and their children
        t0 = time.monotonic()
        ray.shutdown()
        t_shutdown = time.monotonic() - t0
        left = _end_leftovers(started)
    assert not left, f"processes of the run left after ray.shutdown(): {left}"
    print(
        f"ray.init {t_init:.1f}s, manager create {t_create:.1f}s, generate_sequences {t_generate:.1f}s, "
        f"ray.shutdown {t_shutdown:.1f}s; {len(started)} processes started, none left"
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
        entropy_n, token_logp = _teacher_forced(hf, prompt, response)
        expected = torch.zeros(RESPONSE_LENGTH, dtype=torch.float64)
        expected[:n] = entropy_n
        got, model_tokens = row.double(), mask.bool()
        error = _error(got, expected, model_tokens)
        assert error <= ATOL, f"row {i} ({name}): rollout_entropy differs from HF by {error:.3g} nats"
        assert (got[model_tokens] > 0).all()
        # negative controls: the same check fails for the row misaligned by one position (either way), or all zeros
        late = _error(torch.cat([got.new_zeros(1), got[:-1]]), expected, model_tokens)
        early = _error(torch.cat([got[1:], got.new_zeros(1)]), expected, model_tokens)
        zeros = _error(torch.zeros_like(got), expected, model_tokens)
        assert min(late, early, zeros) > 100 * ATOL, f"row {i}: a wrong entropy would pass ({late}, {early}, {zeros})"
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
