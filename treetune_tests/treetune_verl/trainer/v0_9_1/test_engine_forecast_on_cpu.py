# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The live forecast around verl 0.9.1's real engine-worker actor update, on the tiny Qwen2 at 1 and 2 gloo ranks.

Real: verl 0.9.1's ``ActorRolloutRefWorker`` (role ``actor``) built by its own ``init_model`` from the trainer config
(``FSDPEngineWithLMHead``: FSDP2, AdamW, gradient clipping in ``optimizer_step``, verl's PPO loss), its ``update_actor``
with our actor seam (``trainer/v0_9_1/actor_seams.py``) on a ``TensorDict`` laid out as the V1 trainer hands it over
(unpadded nested rows, the ``extra_info`` fields; read from a real GRPO run's batch). Each rank runs in a process of
its own with the CPU runtime patches (``tools/cpu_shims/verl_cpu``, as the e2e runs): a plain update first (AdamW
state), then the forecast update, whose E the forecast samples from the batch's prompts.

The reference is computed here on a plain HF copy of the model with the real step Δθ = θ′ − θ read from the worker's
weights: X per prompt of the E the forecast used from the probe's backward passes (exact, where the forecast takes
central differences of forwards), and the realised change from HF forwards of each sampled sequence at θ and θ′ with
the importance-weighted estimate written out in ``forecast/reference.py`` (no product code).
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from treetune_tests.treetune_verl.forecast.reference import (
    directional_reference,
    full_parameters,
    joined,
    realised_change,
    token_lists,
)

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

PROMPT, RESPONSE, GROUPS, N = 3, 4, 4, 2
LENGTHS = [4, 2, 3, 4, 1, 4, 2, 3]  # row k belongs to group k // N
LR, CLIP_GRAD = 3e-5, 0.05  # lr 3e-5: a step where the central difference is within 1e-3 of the exact value here
FORECAST = {"every": 1, "eval_share": 1.0, "probe": {"estimator": {"baseline": {"mode": "none"}}}}
CPU_RUNTIME = {  # what the e2e script sets for verl 0.9.1 on CPU (test_entropy_e2e.sh)
    "TREETUNE_VERL_CPU_PATCHES": "1",
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
    "CUDA_VISIBLE_DEVICES": "0",
}


def _config(model_path: str, method: str):
    from omegaconf import open_dict

    from treetune_tests.treetune_verl.verl_config import compose_ppo_trainer

    config = compose_ppo_trainer(
        model_path,
        PROMPT,
        RESPONSE,
        [
            "trainer.device=cpu",
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.dtype=float32",
            "++actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
            "actor_rollout_ref.actor.use_torch_compile=False",
            "actor_rollout_ref.model.use_remove_padding=False",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={GROUPS}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",  # rank means of equal rows: the global mean
            f"actor_rollout_ref.rollout.n={N}",
            f"actor_rollout_ref.actor.optim.lr={LR}",
            "actor_rollout_ref.actor.optim.weight_decay=0.01",
            f"actor_rollout_ref.actor.optim.clip_grad={CLIP_GRAD}",
        ],
    )
    with open_dict(config):
        config.actor_rollout_ref.rollout.custom = {"entropy_forecast": {**FORECAST, "method": method}}
    return config


def _rows(seed: int, vocab: int):
    """GROUPS prompts x N responses, as the V1 trainer's update batch of all ranks: ``(nested tensors, uids)``."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, vocab, (GROUPS, PROMPT), generator=gen).repeat_interleave(N, dim=0)
    responses = [torch.randint(2, vocab, (length,), generator=gen) for length in LENGTHS]
    advantages = [
        s * (1 + torch.rand(1, generator=gen)) * torch.ones(len(r))
        for s, r in zip([1, -1] * GROUPS, responses, strict=True)
    ]
    return prompts, responses, advantages, [f"g{k // N}-{seed}" for k in range(GROUPS * N)]


def _batch(worker, seed: int, vocab: int, rank: int, world: int):
    """This rank's rows (``rank, rank + W, ...``: every group split over two ranks) as verl 0.9.1's ``update_actor``
    receives them: nested ``[rows, (len)]`` tensors, the trainer's ``extra_info`` as non-tensor fields, and
    ``old_log_probs`` from the worker's ``compute_log_prob`` as the V1 trainer computes them (a forward without
    backward, which leaves FSDP2's root gathered: the forecast must reshard)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested

    prompts, responses, advantages, uids = _rows(seed, vocab)
    mine = list(range(rank, GROUPS * N, world))

    def nested(tensors):
        return torch.nested.as_nested_tensor([tensors[i] for i in mine], layout=torch.jagged)

    input_ids = [torch.cat([prompts[i], responses[i]]) for i in range(len(uids))]
    ones = [torch.ones(len(r), dtype=torch.int64) for r in responses]
    batch = tu.get_tensordict(
        {
            "input_ids": nested(input_ids),
            "position_ids": nested([torch.arange(len(ids)) for ids in input_ids]),
            "prompts": nested(list(prompts)),
            "responses": nested(responses),
            "response_mask": nested(ones),
            "loss_mask": nested(ones),
            "old_log_probs": nested([torch.zeros(len(r)) for r in responses]),
            "advantages": nested(advantages),
            "uid": np.array([uids[i] for i in mine], dtype=object),
        },
        non_tensor_dict={
            "calculate_entropy": False,
            "distillation_use_topk": False,
            "distillation_only": False,
            "global_batch_size": GROUPS * N,
            "mini_batch_size": GROUPS * N,
            "epochs": 1,
            "seed": 42,
            "dataloader_kwargs": {"shuffle": False},
            "temperature": 1.0,
        },
    )
    log_probs = worker.compute_log_prob(batch.copy())["log_probs"]  # every position of each row
    batch["old_log_probs"] = response_from_nested(log_probs, batch["response_mask"])  # as _compute_old_log_prob
    return batch


def _rank(rank: int, world: int, port: int, model_path: str, out_dir: str, method: str) -> None:
    """One rank: verl's actor worker; a plain update, then the forecast update through the seam; what it saw saved."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    from verl.workers.engine_workers import ActorRolloutRefWorker

    import treetune_verl.trainer.actor_setup  # noqa: F401  (external_lib: installs the actor seam)
    from treetune_verl.forecast.live import STATE_ATTR
    from treetune_verl.patching import original_of

    worker = ActorRolloutRefWorker(_config(model_path, method).actor_rollout_ref, role="actor")
    worker.init_model()
    vocab = worker.actor.model_config.hf_config.vocab_size
    original_of(ActorRolloutRefWorker.update_actor)(worker, _batch(worker, 1, vocab, rank, world))  # AdamW state
    module = worker.actor.engine.module
    before = full_parameters(module)
    output = worker.update_actor(_batch(worker, 2, vocab, rank, world))
    after = full_parameters(module)
    from verl.utils import tensordict_utils as tu

    state = vars(worker)[STATE_ATTR]
    result = {"metrics": tu.get(output, "metrics") if output is not None else None, "E": state.last_eval}
    if rank == 0:
        result |= {"before": before, "after": after}
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(model_path: str, before: dict, after: dict, E: dict[str, torch.Tensor]) -> dict[str, float]:
    """X per prompt of E from the probe on a plain HF model at θ, dotted with Δθ = θ′ − θ; the realised change from
    HF forwards at θ and θ′."""
    from transformers import AutoModelForCausalLM

    from treetune_verl.forecast.settings import ForecastSettings

    def model_at(weights):
        model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32, attn_implementation="sdpa")
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied embeddings
        return model.train()

    settings = ForecastSettings(eval_share=1.0, probe=FORECAST["probe"])
    step = {n: after[n].double() - before[n].double() for n in before}
    out = {"step_norm": math.sqrt(sum(float(t.pow(2).sum()) for t in step.values()))}
    at_theta = model_at(before)
    out |= directional_reference(at_theta, E, step, settings)
    per_prompt = realised_change(at_theta, model_at(after), *token_lists([E]), RESPONSE)
    out["deltaH_realised"] = float(per_prompt.mean())
    out["deltaH_realised_se"] = float(per_prompt.std() / math.sqrt(len(per_prompt)))
    return out


@pytest.mark.parametrize(("world", "method"), [(1, "central_difference"), (2, "backward")])
def test_engine_worker_forecast_matches_the_plain_reference(tiny_model_dir, tmp_path, monkeypatch, world, method):
    from transformers import AutoTokenizer

    for key, value in CPU_RUNTIME.items():
        monkeypatch.setenv(key, value)
    args = (world, _free_port(), str(tiny_model_dir), str(tmp_path), method)
    torch.multiprocessing.spawn(_rank, args=args, nprocs=world)  # fresh interpreters: the CPU patches at start-up
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
    pad_token_id = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    E = joined([result["E"] for result in results], N, RESPONSE, pad_token_id)
    assert E["sequences"].shape[:2] == (GROUPS, N)  # every prompt of the batch once, G = rollout.n fresh responses
    reference = _reference(str(tiny_model_dir), results[0]["before"], results[0]["after"], E)
    reported = [result["metrics"] for result in results if result["metrics"] is not None]
    assert reported, "no rank returned verl's metrics"
    for metrics in reported:
        assert metrics["probe/optimizer_steps"] == 1 and metrics["probe/eval_prompts"] == GROUPS
        assert min(metrics["grad_norm"]) > CLIP_GRAD  # verl clipped the step that was forecast
        assert metrics["probe/step_norm"] == pytest.approx(reference["step_norm"], rel=1e-4)
        for estimator in ("naive", "rb_residual"):
            # abs: float32 gradients summed over ranks (backward method), ~1e-4 of the per-prompt values' spread
            expected = pytest.approx(reference[f"deltaH1/{estimator}"], rel=1e-3, abs=1e-5)
            assert metrics[f"probe/deltaH1/{estimator}"] == expected
            assert metrics[f"probe/deltaH1_se/{estimator}"] > 0
        assert metrics["probe/deltaH_realised"] == pytest.approx(reference["deltaH_realised"], rel=1e-3, abs=1e-7)
        assert metrics["probe/deltaH_realised_se"] == pytest.approx(reference["deltaH_realised_se"], rel=1e-3)
        assert metrics["timing_s/probe"] > 0 and "actor/pg_loss" in metrics  # verl's own metrics pass through
    print({key: value for key, value in reported[0].items() if "deltaH" in key})
