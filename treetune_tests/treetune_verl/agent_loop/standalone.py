# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What the standalone-mode tests share: our manager in verl's standalone rollout mode on a Ray cluster of their own.

``ray_session`` starts that cluster (a declared, not real, GPU; see ``test_entropy_manager_standalone_on_cpu.py`` for
why that is all standalone mode needs on CPU) and, on exit, shuts it down and ends, by pid, any process of the run
left behind; the test asserts ``session.left`` is empty. The model is a copy of the tiny random Qwen2 whose
``eos_token_id`` lists 1 in ``STOP_EVERY`` token ids (weights unchanged), so that turns end after a few tokens.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import ray
import torch
from omegaconf import open_dict

from treetune_verl.sglang.engine import CPU_ENGINE_KWARGS

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 128
REPO_ROOT = Path(__file__).resolve().parents[3]
STOP_EVERY = 8  # 1 in STOP_EVERY token ids ends a turn


@pytest.fixture
def driver_state_restored(monkeypatch):
    """The manager imports our replica in this process, which runs verl's sglang loader (``_load_sglang``: sets
    ``SGLANG_USE_CPU_ENGINE=1``) and verl's ``sglang_rollout`` (replaces sglang's ``engine._set_envs_and_config`` at
    import). Undo both here, so the in-process Engine tests that run later in the session see sglang as shipped."""
    from sglang.srt.entrypoints import engine

    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)  # restored to its current state at teardown
    original = engine._set_envs_and_config
    yield
    engine._set_envs_and_config = original


def model_with_short_turns(tiny_model_dir: Path, dest: Path) -> Path:
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
def teacher_forced(model, prompt: list[int], response: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy (nats) of the next-token distribution at each response position, and log p(response token)."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double()
    logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) + len(response) - 1], dim=-1)  # [len(response), V]
    entropy = -(logp.exp() * logp).sum(dim=-1)
    token_logp = logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
    return entropy, token_logp


def last_turn_start(mask: torch.Tensor) -> int:
    """Where the last model turn of a ``[R]`` response mask starts (its last run of 1s after a 0)."""
    values = mask.tolist()
    return max(i for i in range(1, len(values)) if values[i] == 1 and values[i - 1] == 0)


def entropy_error(row: torch.Tensor, expected: torch.Tensor, model_tokens: torch.Tensor) -> float:
    """Largest |rollout_entropy - recomputation| over model tokens (nats), all ``[R]``; inf if a position outside
    ``model_tokens`` (user/tool token, padding) is non-zero."""
    if row[~model_tokens].any():
        return float("inf")
    return (row[model_tokens] - expected[model_tokens]).abs().max().item()


def check_entropy_row(
    label: str, got: torch.Tensor, expected: torch.Tensor, model_tokens: torch.Tensor, atol: float
) -> tuple[float, float, float, float]:
    """Assert one row's entropy matches the recomputation within ``atol`` nats at model tokens (0.0 elsewhere), and
    that the same check fails for the row misaligned by one position (either way) or all zeros; returns the error and
    those three (all ``[R]`` float64)."""
    error = entropy_error(got, expected, model_tokens)
    assert error <= atol, f"{label}: rollout_entropy differs from HF by {error:.3g} nats"
    assert (got[model_tokens] > 0).all()
    late = entropy_error(torch.cat([got.new_zeros(1), got[:-1]]), expected, model_tokens)
    early = entropy_error(torch.cat([got[1:], got.new_zeros(1)]), expected, model_tokens)
    zeros = entropy_error(torch.zeros_like(got), expected, model_tokens)
    assert min(late, early, zeros) > 100 * atol, f"{label}: a wrong entropy would pass ({late}, {early}, {zeros})"
    return error, late, early, zeros


def other_weights(model_path: Path, dest: Path) -> Path:
    """A copy of the model with every weight moved by 10 % of its tensor's spread (seeded)."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(model_path, dest)
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            spread = param.std() if param.numel() > 1 else param.abs()
            param.add_(0.1 * spread * torch.randn(param.shape, generator=generator))
    model.save_pretrained(dest)
    return dest


def load_weights(address: str, model_path: Path) -> None:
    """Have the sglang server at ``address`` load ``model_path``'s weights (``/update_weights_from_disk``, as a
    weight sync would)."""
    request = urllib.request.Request(
        f"http://{address}/update_weights_from_disk",
        data=json.dumps({"model_path": str(model_path)}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        assert json.loads(reply.read())["success"], "sglang did not load the new weights"


def standalone_config(model_path: Path, workdir: Path):
    from treetune_tests.treetune_verl.agent_loop.fakes import compose_config  # verl 0.7.1 (its interactions)

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


def descendants(pid: int) -> set[int]:
    return {child.pid for child in psutil.Process(pid).children(recursive=True)}


def pids_of(handle) -> list[int]:
    """An actor's process and all its descendants (for the server actor: sglang's scheduler and detokenizer)."""

    def pids(_self):
        import psutil

        me = psutil.Process()
        return [me.pid] + [child.pid for child in me.children(recursive=True)]

    return ray.get(handle.__ray_call__.remote(pids))


def alive(pids: set[int]) -> dict[int, str]:
    left = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                left[pid] = " ".join(process.cmdline())[:120] or process.name()
        except psutil.NoSuchProcess:
            pass
    return left


def end_leftovers(pids: set[int], grace_s: float = 30.0) -> dict[int, str]:
    """Wait up to ``grace_s`` for ``pids`` (processes this test started) to exit; kill, by pid, what is left.
    Returns what was left (pid -> command line)."""
    deadline = time.monotonic() + grace_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(1)
    left = alive(pids)
    for pid in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    return left


def server_info(address: str) -> dict:
    with urllib.request.urlopen(f"http://{address}/server_info", timeout=30) as reply:
        return json.loads(reply.read())


@dataclass
class RaySession:
    """The processes a standalone run started, its timings, and (after the session) what was left of it."""

    started: set[int] = field(default_factory=set)
    seconds: dict[str, float] = field(default_factory=dict)
    left: dict[int, str] = field(default_factory=dict)

    def track(self, *handles) -> None:
        """Count the processes of these actors (and their children: sglang's scheduler and detokenizer) as the run's."""
        for handle in handles:
            self.started |= set(pids_of(handle))


@contextlib.contextmanager
def ray_session(monkeypatch) -> Iterator[RaySession]:
    """A local Ray cluster of our own with one declared GPU; on exit ``ray.shutdown()`` and the leftovers ended."""
    env_vars = {
        # Ray's workers import the tool / interaction / loop classes of the test's config (fakes.py).
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        # Not needed on this path (the CPU patches are for the FSDP actor and the weight sync of the trainer): off,
        # so that the tests show standalone mode needs none of them.
        "TREETUNE_VERL_CPU_PATCHES": "0",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key, value in env_vars.items():
        monkeypatch.setenv(key, value)
    session = RaySession()
    before = descendants(os.getpid())
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
    session.seconds["ray.init"] = time.monotonic() - t0
    try:
        node = ray._private.worker._global_node
        session.started |= {info.process.pid for infos in node.all_processes.values() for info in infos}
        yield session
    finally:
        session.started |= descendants(os.getpid()) - before  # Ray's GCS, raylet, workers and their children
        t0 = time.monotonic()
        ray.shutdown()
        session.seconds["ray.shutdown"] = time.monotonic() - t0
        session.left = end_leftovers(session.started)
