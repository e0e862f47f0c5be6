# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The live forecast around verl 0.9.1's real engine-worker actor update, on the tiny Qwen2 at 1 and 2 gloo ranks.

Real: verl 0.9.1's ``ActorRolloutRefWorker`` (role ``actor``) built by its own ``init_model`` from the trainer config
(``FSDPEngineWithLMHead``: FSDP2, AdamW, gradient clipping in ``optimizer_step``, verl's PPO loss), its ``update_actor``
with our actor seam (``verl/v0_9_1/actor_seams.py``) on a ``TensorDict`` laid out as the V1 trainer hands it over
(unpadded nested rows, the ``extra_info`` fields; read from a real GRPO run's batch). Each rank runs in a process of
its own with the CPU runtime patches (``tools/cpu_shims/verl_cpu``, as the e2e runs): a plain update first (AdamW
state), then the forecast update. At 1 rank the forecast samples E from the batch's prompts (no E in the batch: the
worker driven without our V1 trainer); at 2 ranks E is the rollout's, in the batch's ``FORECAST_EVAL_META_KEY`` field
as our ``_update_actor`` seam puts it into ``extra_info`` (responses from a generator of their own, not U's), and each
rank forecasts with its share (uids ``rank, rank + W, ...``).

The reference is computed here on a plain HF copy of the model with the real step Δθ = θ′ − θ read from the worker's
weights: ⟨X_b, Δθ⟩ per prompt of the E the forecast used and the tangent of E's token entropy, by autograd of the
surrogates written out in ``forecast/reference.py`` (exact, where the forecast takes central differences of
forwards; no product code), the realised change of E's token entropy at its states and the importance-weighted
realised change of its sequence entropy from HF forwards at θ and θ′.
"""

from __future__ import annotations

import importlib.metadata
import math
import socket
from pathlib import Path

import pytest
import torch

from treetune_tests.treetune_verl.forecast.given_eval import given_eval
from treetune_tests.treetune_verl.forecast.reference import (
    directional_reference,
    full_parameters,
    joined,
    realised_change,
    softmax_reference,
    token_entropy_reference,
    token_lists,
)
from treetune_tests.treetune_verl.verl.v0_9_1.engine_actor import (
    CPU_RUNTIME,
    actor_config,
    join_process_group,
    update_batch,
)
from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

PROMPT, RESPONSE, GROUPS, N = 3, 4, 4, 2
LENGTHS = [4, 2, 3, 4, 1, 4, 2, 3]  # row k belongs to group k // N
LR, CLIP_GRAD = 3e-5, 0.05  # lr 3e-5: a step where the central difference is within 1e-3 of the exact value here
FORECAST = {"every": 1, "eval_share": 1.0, "probe": {"estimator": {"baseline": {"mode": "none"}}}}


def _config(model_path: str, method: str):
    from omegaconf import open_dict

    config = actor_config(model_path, PROMPT, RESPONSE, GROUPS * N, N, micro_rows=2, lr=LR, clip_grad=CLIP_GRAD)
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


def _rollout_eval(vocab: int):
    """E as the V1 trainer seam hands it to the actor: the update batch's prompts (sorted by uid), N responses each
    (lengths 1 to RESPONSE, from a generator of their own: not the batch's responses), the same on every rank."""
    prompts, _, _, row_uids = _rows(2, vocab)
    uids = sorted(set(row_uids))
    return given_eval(uids, [prompts[row_uids.index(uid)] for uid in uids], N, vocab, RESPONSE, seed=7)


def _batch(worker, seed: int, vocab: int, rank: int, world: int, rollout_eval=None):
    """This rank's rows (``rank, rank + W, ...``: every group split over two ranks) as verl 0.9.1's ``update_actor``
    receives them (``engine_actor.update_batch``; its ``compute_log_prob``, a forward without backward, leaves FSDP2's
    root gathered: the forecast must reshard); with ``rollout_eval``, the rollout's E in its field."""
    from verl.utils import tensordict_utils as tu

    prompts, responses, advantages, uids = _rows(seed, vocab)
    mine = list(range(rank, GROUPS * N, world))
    batch = update_batch(
        worker,
        [prompts[i] for i in mine],
        [responses[i] for i in mine],
        [advantages[i] for i in mine],
        [uids[i] for i in mine],
        rows_per_mini_batch=GROUPS * N,
    )
    if rollout_eval is not None:  # as verl's transferqueue_utils turns the trainer's extra_info into fields
        tu.assign_non_tensor_data(batch, FORECAST_EVAL_META_KEY, rollout_eval)
    return batch


def _rank(rank: int, world: int, port: int, model_path: str, out_dir: str, method: str) -> None:
    """One rank: verl's actor worker; a plain update, then the forecast update through the seam; what it saw saved."""
    join_process_group(rank, world, port)
    from verl.workers.engine_workers import ActorRolloutRefWorker

    import treetune_verl.verl.process_setup  # noqa: F401  (external_lib: installs the actor seam)
    from treetune_verl.forecast.live import STATE_ATTR
    from treetune_verl.patching import original_of

    worker = ActorRolloutRefWorker(_config(model_path, method).actor_rollout_ref, role="actor")
    worker.init_model()
    vocab = worker.actor.model_config.hf_config.vocab_size
    original_of(ActorRolloutRefWorker.update_actor)(worker, _batch(worker, 1, vocab, rank, world))  # AdamW state
    module = worker.actor.engine.module
    before = full_parameters(module)
    rollout_eval = _rollout_eval(vocab) if world > 1 else None
    output = worker.update_actor(_batch(worker, 2, vocab, rank, world, rollout_eval))
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


def _reference(model_path: str, before: dict, after: dict, E: dict[str, torch.Tensor], units=None) -> dict[str, float]:
    """⟨X_b, Δθ⟩ and the token-entropy tangent per prompt of E by autograd of the surrogates written in
    ``reference.py`` on a plain HF model at θ, Δθ = θ′ − θ; the realised changes from HF forwards at θ and θ′."""
    from transformers import AutoModelForCausalLM

    def model_at(weights):
        model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32, attn_implementation="sdpa")
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied embeddings
        return model.train()

    step = {n: after[n].double() - before[n].double() for n in before}
    out = {"step_norm": math.sqrt(sum(float(t.pow(2).sum()) for t in step.values()))}
    at_theta, at_theta_prime = model_at(before), model_at(after)
    out |= directional_reference(at_theta, E, step, RESPONSE)  # baseline none, as FORECAST["probe"] sets
    out["token"] = token_entropy_reference(at_theta, at_theta_prime, E, out.pop("token_tangent"), units)
    if units is None:  # central differences: the forecast exact in the softmax too
        out["token"] |= softmax_reference(at_theta, at_theta_prime, E, step)
    per_prompt = realised_change(at_theta, at_theta_prime, *token_lists([E]), RESPONSE)
    out["deltaH_realised"] = float(per_prompt.mean())
    out["deltaH_realised_se"] = float(per_prompt.std() / math.sqrt(len(per_prompt)))
    return out


@pytest.mark.parametrize(("world", "method"), [(1, "central_difference"), (2, "backward")])
def test_engine_worker_forecast_matches_the_plain_reference(tiny_model_dir, tmp_path, monkeypatch, world, method):
    from transformers import AutoConfig, AutoTokenizer

    for key, value in CPU_RUNTIME.items():
        monkeypatch.setenv(key, value)
    args = (world, _free_port(), str(tiny_model_dir), str(tmp_path), method)
    torch.multiprocessing.spawn(_rank, args=args, nprocs=world)  # fresh interpreters: the CPU patches at start-up
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
    pad_token_id = AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    E_batches = [result["E"] for result in results]
    E = joined(E_batches, N, RESPONSE, pad_token_id)
    assert E["sequences"].shape[:2] == (GROUPS, N)  # every prompt of the batch once, G = rollout.n fresh responses
    if world > 1:  # exactly the rollout's E, prompt for prompt (ranks take uids rank, rank + W, ...)
        rollout = _rollout_eval(AutoConfig.from_pretrained(tiny_model_dir).vocab_size)
        order = [b for rank in range(world) for b in range(rank, GROUPS, world)]
        assert token_lists(E_batches) == (
            [rollout.prompt_ids[b].tolist() for b in order],
            [[r.tolist() for r in rollout.response_ids[b]] for b in order],
        )
    # the token entropy's units: each response (central differences), each prompt index summed over the ranks (backward)
    per_rank = GROUPS // world
    units = (
        None
        if method == "central_difference"
        else [[(rank * per_rank + b, g) for rank in range(world) for g in range(N)] for b in range(per_rank)]
    )
    reference = _reference(str(tiny_model_dir), results[0]["before"], results[0]["after"], E, units)
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
        for key, value in reference["token"].items():  # E's token entropy (tolerances: forecast/test_live_forecast)
            rel = 0.1 if key.endswith("error_se") else 2e-3
            assert metrics[f"probe/token/{key}"] == pytest.approx(value, rel=rel, abs=5e-7), key
        assert ("probe/token/deltaH_softmax" in metrics) == (method == "central_difference")
        rate = metrics["probe/token/deltaH1"] / metrics["probe/token/H_before"]
        assert metrics["probe/warning/rate"] == pytest.approx(rate, rel=1e-12)  # the warning reads the token forecast
        if "probe/token/deltaH1_on_policy" in metrics:  # and the on-policy one (not the backward method's)
            on_policy = metrics["probe/token/deltaH1_on_policy"] / metrics["probe/token/H_before"]
            assert metrics["probe/warning/rate_on_policy"] == pytest.approx(on_policy, rel=1e-12)
        else:
            assert math.isnan(metrics["probe/warning/rate_on_policy"])
        assert metrics["timing_s/probe"] > 0 and "actor/pg_loss" in metrics  # verl's own metrics pass through
        assert (metrics["probe/sample_s"] == 0) == (world > 1)  # the rollout's E: nothing sampled in the actor
    print({key: value for key, value in reported[0].items() if "deltaH" in key})
