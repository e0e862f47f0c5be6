# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The live forecast around verl 0.7.1's real ``DataParallelPPOActor.update_policy`` on a tiny Qwen2.

Real: verl's actor (mini-batches, PPO loss, clipping in ``_optimizer_step``, AdamW with weight decay and a state from
an earlier real update), torch's FSDP2 (``fully_shard``) over one and two gloo ranks. The reference is computed on a
plain copy of the model with the real step's Δθ = θ′ − θ read from the weights (not the forecast's dry-run), on the
E the forecast sampled (every rank's share, rebuilt with ``make_probe_batch``), all of it written out in
``reference.py`` on HF forwards (log-softmax, per-token entropies, the estimators' surrogates, importance weights and
the leave-one-out control variate: no product code): ⟨X_b, Δθ⟩ per prompt and the tangent of E's token entropy by
autograd at θ (exact, where the forecast takes central differences of forwards), the realised change of E's token
entropy at its states and the importance-weighted realised change of its sequence entropy after that step; two ranks,
whose rows split every group, too. E either sampled by the forecast in the actor or given as the rollout hands it over
(``meta_info[FORECAST_EVAL_META_KEY]``, responses fixed here): the same reference, read from the E the forecast used.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from verl import DataProto
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import FSDPActorConfig, FSDPEngineConfig

from treetune_tests.tiny_model import tiny_causal_lm
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
from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY
from treetune_verl.forecast.live import ForecastRun, ForecastState
from treetune_verl.forecast.rollout_eval import EvalResponses
from treetune_verl.forecast.settings import ForecastSettings
from treetune_verl.patching import original_of
from treetune_verl.probe import teacher_forcing

PROMPT, RESPONSE, VOCAB, GROUPS, N = 3, 4, 32, 4, 2
LENGTHS = [4, 2, 3, 4, 1, 4, 2, 3]  # row k belongs to group k // N
# order-free (ranks see other orders); E every prompt of the batch
SETTINGS = ForecastSettings(eval_share=1.0, probe={"estimator": {"baseline": {"mode": "none"}}})
# lr 1e-4: step norm 4e-3, where the forecast's central difference is within 1e-3 of the exact directional derivative
# (its O(|Δθ|³) term; test_directional_on_cpu.py measures it against forward-mode autodiff at larger steps too).
LR, WEIGHT_DECAY, GRAD_CLIP = 1e-4, 0.01, 0.05


def _model() -> torch.nn.Module:
    return tiny_causal_lm("qwen2", VOCAB, 16, lm_head_std=0.5, pad_token_id=0, bos_token_id=None, eos_token_id=1)


def _data(seed: int) -> DataProto:
    """GROUPS prompts x N responses; GRPO-like advantages (one value per row, opposite within a group)."""
    gen = torch.Generator().manual_seed(seed)
    rows = GROUPS * N
    prompts = torch.randint(2, VOCAB, (GROUPS, PROMPT), generator=gen).repeat_interleave(N, dim=0)
    responses = torch.randint(2, VOCAB, (rows, RESPONSE), generator=gen)
    response_mask = (torch.arange(RESPONSE)[None, :] < torch.tensor(LENGTHS)[:, None]).to(torch.int64)
    responses = responses * response_mask  # pad id 0 after the response
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([torch.ones(rows, PROMPT, dtype=torch.int64), response_mask], dim=1)
    sign = torch.tensor([1.0, -1.0]).repeat(GROUPS) * (1 + torch.rand(rows, generator=gen))
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": response_mask,
        "advantages": sign[:, None] * response_mask,
        "old_log_probs": torch.zeros(rows, RESPONSE),
    }
    uid = np.array([f"g{k // N}-{seed}" for k in range(rows)], dtype=object)
    return DataProto.from_dict(
        tensors=tensors, non_tensors={"uid": uid}, meta_info={"temperature": 1.0, "pad_token_id": 0}
    )


def _config(mini: int, epochs: int = 1) -> FSDPActorConfig:
    return FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=2,
        loss_agg_mode="seq-mean-token-mean",  # per-rank means of equal row counts average to the global mean
        entropy_coeff=0.0,
        use_kl_loss=False,
        ppo_epochs=epochs,
        rollout_n=N,
        use_torch_compile=False,
        use_remove_padding=False,
        grad_clip=GRAD_CLIP,
        fsdp_config=FSDPEngineConfig(dtype="float32"),
    )


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)


def _rollout_eval(data: DataProto) -> EvalResponses:
    """E as our manager hands it over: the batch's prompts (sorted by uid), N responses each (lengths 1 to RESPONSE,
    ids from a generator of their own: not the batch's responses), the same on every rank."""
    uids = sorted(set(data.non_tensor_batch["uid"]))
    first = [list(data.non_tensor_batch["uid"]).index(uid) for uid in uids]
    prompts = [data.batch["input_ids"][i, :PROMPT] for i in first]
    return given_eval(uids, prompts, N, VOCAB, RESPONSE, seed=7)


def _rank_rows(data: DataProto, rank: int, world: int) -> DataProto:
    return data.select_idxs(list(range(rank, len(data), world)))  # world 2: every group split over the ranks


def _fsdp2_actor(rank: int, world: int, mini_rows: int) -> DataParallelPPOActor:
    """verl's actor on the FSDP2-wrapped tiny model, after one plain update of this rank's rows (AdamW state)."""
    from torch.distributed.fsdp import fully_shard

    model = _model().train()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    actor = DataParallelPPOActor(_config(mini_rows // world), model, _optimizer(model))
    actor.update_policy(_rank_rows(_data(seed=1), rank, world))
    return actor


def _run(
    rank: int, world: int, store: str, out_dir: str, mini_rows: int, compare_plain: bool, method: str, given: bool
) -> None:
    """FSDP2 actor: one plain update (AdamW state), then a forecast update (E the rollout's when ``given``); metrics
    and the real Δθ norm saved."""
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timeout)
    try:
        actor = _fsdp2_actor(rank, world, mini_rows)
        model = actor.actor_module
        before = full_parameters(model)
        data = _rank_rows(_data(seed=2), rank, world)
        if given:
            data.meta_info[FORECAST_EVAL_META_KEY] = _rollout_eval(_data(seed=2))
        # as verl's trainer does before update_actor: a forward without backward leaves FSDP2's root gathered
        old_log_prob_batch = DataProto.from_dict(
            tensors=dict(data.batch.items()),
            meta_info={"temperature": 1.0, "micro_batch_size": 2, "use_dynamic_bsz": False},
        )
        actor.compute_log_prob(old_log_prob_batch)
        update = original_of(DataParallelPPOActor.update_policy)
        state = ForecastState()
        settings = dataclasses.replace(SETTINGS, method=method)
        with pytest.MonkeyPatch.context() as patch:
            # each prompt of E computed once for its responses, though that saves 3 tokens here (the path of real
            # shapes, from 64 tokens saved): the forwards over E under FSDP2 with HF's KV cache
            patch.setattr(teacher_forcing, "MIN_SHARED_PROMPT_TOKENS", 1)
            cached = []  # forwards over several response tokens given their prompt's KV cache (not decode steps)
            hook = model.register_forward_pre_hook(
                lambda module, args, kwargs: cached.append(
                    kwargs.get("past_key_values") is not None and kwargs["input_ids"].shape[1] > 1
                ),
                with_kwargs=True,
            )
            verl_metrics, metrics = ForecastRun.from_dp_actor(actor, data, settings, state, N, [1]).around(
                lambda: update(actor, data)
            )
            hook.remove()
        after = full_parameters(model)
        step_norm = math.sqrt(sum(float((after[n].double() - before[n].double()).pow(2).sum()) for n in before))
        result = {"metrics": metrics, "verl": verl_metrics, "real_step_norm": step_norm, "E": state.last_eval}
        result["cached_forwards"] = sum(cached)
        if compare_plain:  # the same two updates without the forecast, from the same start
            plain = _fsdp2_actor(rank, world, mini_rows)
            plain.update_policy(_rank_rows(_data(seed=2), rank, world))
            plain_after = full_parameters(plain.actor_module)
            result["max_diff_to_plain"] = max(float((after[n] - plain_after[n]).abs().max()) for n in after)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _ranks(
    world: int,
    tmp_path: Path,
    mini_rows: int,
    compare_plain: bool = False,
    method: str = "central_difference",
    given: bool = False,
) -> list[dict]:
    """One rank in this process (its process group destroyed after), two in spawned processes."""
    args = (world, str(tmp_path / "store"), str(tmp_path), mini_rows, compare_plain, method, given)
    if world == 1:
        _run(0, *args)
    else:
        torch.multiprocessing.spawn(_run, args=args, nprocs=world)
    return [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


def _reference(E: dict[str, torch.Tensor], E_batches: list[dict[str, torch.Tensor]], units=None) -> dict[str, float]:
    """Plain model, verl's actor without FSDP: the real step's Δθ, ⟨X_b, Δθ⟩ and the token-entropy tangent per prompt
    of E by autograd of surrogates written in ``reference.py``, the realised changes from HF forwards."""
    model = _model().train()
    actor = DataParallelPPOActor(_config(GROUPS * N), model, _optimizer(model))
    update = original_of(DataParallelPPOActor.update_policy)
    update(actor, _data(seed=1))
    data = _data(seed=2)
    probe_model = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    update(actor, data)
    step = {n: p.detach().double() - before[n].double() for n, p in model.named_parameters()}
    out = {"step_norm": math.sqrt(sum(float(t.pow(2).sum()) for t in step.values()))}
    out |= directional_reference(probe_model, E, step, RESPONSE)
    out["token"] = token_entropy_reference(probe_model, model, E, out.pop("token_tangent"), units)
    if units is None:  # central differences: the forecast exact in the softmax too
        out["token"] |= softmax_reference(probe_model, model, E, step)
    per_prompt = realised_change(probe_model, model, *token_lists(E_batches), RESPONSE)
    out["deltaH_realised"] = float(per_prompt.mean())
    out["deltaH_realised_se"] = float(per_prompt.std() / math.sqrt(len(per_prompt)))
    return out


def _with_rank_zero(fn, *args):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dist, "get_rank", lambda *a, **k: 0)  # dp_actor prints the rank
        return fn(*args)


@pytest.mark.parametrize(
    ("world", "method", "given"),
    [
        (1, "central_difference", False),
        (2, "central_difference", False),
        (1, "backward", False),
        (2, "backward", False),
        (2, "central_difference", True),  # E from the rollout, each rank its share
    ],
)
def test_fsdp2_forecast_matches_the_plain_reference(tmp_path, world, method, given):
    results = _ranks(world, tmp_path, mini_rows=GROUPS * N, method=method, given=given)  # one optimizer step
    E_batches = [result["E"] for result in results]
    E = joined(E_batches, N, RESPONSE)
    assert E["sequences"].shape[:2] == (GROUPS, N)  # every prompt once, G = rollout.n fresh responses
    if given:  # exactly the rollout's E, prompt for prompt (ranks take uids rank, rank + W, ...): not U's rows
        rollout = _rollout_eval(_data(seed=2))
        order = [b for rank in range(world) for b in range(rank, GROUPS, world)]
        assert token_lists(E_batches) == (
            [rollout.prompt_ids[b].tolist() for b in order],
            [[r.tolist() for r in rollout.response_ids[b]] for b in order],
        )
        assert all(result["metrics"]["probe/sample_s"] == 0.0 for result in results)
    # the token entropy's units: each response (central differences), each prompt index summed over the ranks (backward)
    per_rank = GROUPS // world
    units = (
        None
        if method == "central_difference"
        else [[(rank * per_rank + b, g) for rank in range(world) for g in range(N)] for b in range(per_rank)]
    )
    reference = _with_rank_zero(_reference, E, E_batches, units)
    for result in results:
        metrics = result["metrics"]
        assert metrics["probe/optimizer_steps"] == 1 and metrics["probe/eval_prompts"] == GROUPS
        assert result["cached_forwards"] > 0, "no forward over E took its prompts' KV cache"
        assert min(result["verl"]["actor/grad_norm"]) > GRAD_CLIP  # verl clipped the step that was forecast
        assert metrics["probe/step_norm"] == pytest.approx(result["real_step_norm"], rel=1e-4)
        assert metrics["probe/step_norm"] == pytest.approx(reference["step_norm"], rel=1e-4)
        for estimator in SETTINGS.estimators:
            assert metrics[f"probe/deltaH1/{estimator}"] == pytest.approx(reference[f"deltaH1/{estimator}"], rel=1e-3)
            assert metrics[f"probe/deltaH1_se/{estimator}"] > 0
            if method == "central_difference":  # every prompt's own value, over all ranks' prompts
                expected_se = reference[f"deltaH1_se/{estimator}"]
                assert metrics[f"probe/deltaH1_se/{estimator}"] == pytest.approx(expected_se, rel=2e-3)
        assert metrics["probe/deltaH_realised"] == pytest.approx(reference["deltaH_realised"], rel=1e-3, abs=1e-7)
        assert metrics["probe/deltaH_realised_se"] == pytest.approx(reference["deltaH_realised_se"], rel=1e-3)
        assert metrics["probe/deltaH_realised_first_step"] == metrics["probe/deltaH_realised"]
        token = reference["token"]
        for key, value in token.items():  # E's token entropy: tangent, realised at E's states, standard errors
            # abs: float32 forwards round each entropy (~3.4 nats here) to ~4e-7, and the step moves it by ~2e-5;
            # error_se is of realised − forecast, a second-order quantity, where the central difference's own
            # O(|Δθ|³) error is a few per cent (5.5 % seen on verl 0.9.1's test)
            rel = 0.1 if key.endswith("error_se") else 2e-3
            assert metrics[f"probe/token/{key}"] == pytest.approx(value, rel=rel, abs=5e-7), key
        assert metrics["probe/token/deltaH_realised_first_step"] == metrics["probe/token/deltaH_realised"]
        assert ("probe/token/deltaH_softmax" in metrics) == (method == "central_difference")
        # the early warning reads the token forecast: its relative rate per training step (one optimizer step)
        rate = metrics["probe/token/deltaH1"] / metrics["probe/token/H_before"]
        assert metrics["probe/warning/rate"] == pytest.approx(rate, rel=1e-12)
        assert metrics["timing_s/probe"] > 0 and metrics["probe/update_s"] > 0
        assert "actor/pg_loss" in result["verl"]  # verl's own metrics pass through
    if world == 2:  # the metrics the trainer averages over ranks are the same on both
        assert results[0]["metrics"]["probe/deltaH1/naive"] == pytest.approx(
            results[1]["metrics"]["probe/deltaH1/naive"]
        )
    print({key: value for key, value in results[0]["metrics"].items() if "deltaH" in key})


@pytest.mark.parametrize("world", [1, 2])
def test_two_optimizer_steps_train_exactly_as_without_the_forecast(tmp_path, world):
    """The forecast moves the weights to θ and θ − Δθ between verl's first and second optimizer step: the second
    mini-batch must still see θ′ (FSDP2 keeps gathered copies across forwards), so training is bit-identical."""
    results = _ranks(world, tmp_path, mini_rows=GROUPS * N // 2, compare_plain=True)  # two optimizer steps
    for result in results:
        metrics = result["metrics"]
        assert metrics["probe/optimizer_steps"] == 2
        first, whole = metrics["probe/deltaH_realised_first_step"], metrics["probe/deltaH_realised"]
        assert math.isfinite(first) and math.isfinite(whole) and first != whole
        assert result["real_step_norm"] > metrics["probe/step_norm"] > 0  # the forecast is of the first step only
        assert result["max_diff_to_plain"] == 0.0


def _sharpening_data(seed: int) -> DataProto:
    """``_data`` with every positively rewarded response made of one token (5): each update raises its probability
    at every state, so the policy's entropy falls update after update."""
    data = _data(seed)
    positive = data.batch["advantages"][:, 0] > 0
    sharp = torch.where(data.batch["response_mask"].bool(), 5, 0)
    data.batch["responses"][positive] = sharp[positive]
    data.batch["input_ids"][positive, PROMPT:] = sharp[positive]
    return data


def _updates_with_warnings(store: str, lr: float, updates: int) -> list[dict[str, float]]:
    """One gloo rank, verl's actor on the FSDP2-wrapped tiny model: ``updates`` forecast updates in a row on
    sharpening batches, one ``ForecastState`` across them (E sampled in the actor each time); every update's metrics."""
    from torch.distributed.fsdp import fully_shard

    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1, timeout=timeout)
    try:
        model = _model().train()
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        actor = DataParallelPPOActor(_config(GROUPS * N), model, optimizer)
        update, state, seen = original_of(DataParallelPPOActor.update_policy), ForecastState(), []
        for k in range(updates):
            data = _sharpening_data(seed=10 + k)
            _, metrics = ForecastRun.from_dp_actor(actor, data, SETTINGS, state, N, [1]).around(
                lambda data=data: _with_rank_zero(update, actor, data)
            )
            seen.append(metrics)
        return seen
    finally:
        dist.destroy_process_group()


def test_the_early_warning_reads_the_token_forecast_and_warns_before_entropy_halves(tmp_path):
    """The path forecast -> early warning on a real run of updates: verl's actor sharpening its policy at lr 2e-2
    warns (from the second forecast on: the first is skipped), and at its first warning E's token entropy is still
    above half of the first forecast's; the rate it reports is the token forecast's relative rate. Negative
    control: the same updates at lr 1e-6 never warn."""
    sharpening = _updates_with_warnings(str(tmp_path / "a"), lr=2e-2, updates=8)
    entropy = [m["probe/token/H_before"] for m in sharpening]
    assert entropy[-1] < 0.5 * entropy[0], entropy  # the run collapses
    warned = [i for i, m in enumerate(sharpening) if m["probe/warning/collapse"] == 1.0]
    assert warned and warned[0] >= 1 and entropy[warned[0]] > 0.5 * entropy[0], (warned, entropy)
    for m in sharpening:
        rate = m["probe/token/deltaH1"] / m["probe/token/H_before"]  # one optimizer step per update
        assert m["probe/warning/rate"] == pytest.approx(rate, rel=1e-12)
        on_policy = m["probe/token/deltaH1_on_policy"] / m["probe/token/H_before"]  # the second projected forecast
        assert m["probe/warning/rate_on_policy"] == pytest.approx(on_policy, rel=1e-12)
    assert sharpening[0]["probe/warning/collapse"] == 0.0  # skipped, however steep
    quiet = _updates_with_warnings(str(tmp_path / "b"), lr=1e-6, updates=8)
    assert all(m["probe/warning/collapse"] == 0.0 for m in quiet), [m["probe/warning/rate"] for m in quiet]
    assert max(abs(m["probe/warning/rate"]) for m in quiet) < 1e-3
