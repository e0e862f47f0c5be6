# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""One forecast around verl's actor update: ΔH₁ of its first optimizer step, and the realised entropy change.

Shape notation (this rank): B = prompts of E, G = responses per prompt (``rollout.n``), W = data-parallel ranks,
R = the response budget (``data.max_response_length``). Units: nats per budget token (H_seq / R, the probe's target
with L_max = R fixed, so its normalised estimators are unbiased).

E = the prompts of the batch verl is about to train on (``verl_batch.py``) with G fresh responses each, sampled from
the actor at θ before anything moves; U = the batch itself, through verl's own loss. At the update's first optimizer
step (``DataParallelPPOActor._optimizer_step``, once per mini-batch; the first one holds verl's gradient of the first
mini-batch at θ):

    Δθ        = the step verl takes there (its clipping, its optimizer and state): θ′ − θ read from the weights
                (this rank's shards; the difference of two nearby float32 values is exact)
    ΔH₁[e]    = mean_b ⟨X_b, Δθ⟩ for each X estimator e (naive, rb_residual) on E at θ (the weights are set back
                to θ for these passes and to θ′ after them); ``deltaH1_se`` = the standard error over E's prompts
    realised  = Ĥ(θ′) − Ĥ(θ) on E's responses (importance weights with a leave-one-out control variate,
                ``probe/ground_truth.py``): θ′ after the first optimizer step (``deltaH_realised_first_step``) and
                after the whole update, all mini-batches and epochs (``deltaH_realised``); identical when the update
                is one optimizer step (``ppo_mini_batch_size`` = the batch, ``ppo_epochs=1``)

ΔH₁ uses nothing of θ′ but Δθ, the same Δθ a dry run of the optimizer would give (``probe/optimizer_step.py``), which
for a 135M-parameter AdamW costs a float64 copy of parameters and state (measured 20-90 s per step on the shared
2-core machine, more than the update itself); two float32 copies of this rank's shards cost a memcpy each. The
forecast needs no Y pass: Δθ comes from verl's gradient (PPO clip at ratio 1 on the first mini-batch, its
aggregation, KL and entropy terms if on). E's samples are independent of U's, so ⟨X̄, Δθ⟩ is unbiased for
⟨∇H, Δθ⟩ and the importance-weighted realised change is unbiased too (θ′ depends on U only).

FSDP2: Δθ and every inner product are over this rank's shards (``sharding.py``); FSDP averages each backward's gradient over the W
ranks, so the shard inner products, summed over ranks, give per prompt index i the mean over ranks of
⟨X_{r,i}, Δθ⟩, whose mean over i is ΔH₁ (every rank holds the same number of prompts).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from treetune_verl.forecast.settings import ForecastSettings
from treetune_verl.forecast.sharding import is_sharded, local_tensor
from treetune_verl.forecast.verl_batch import eval_prompts, world
from treetune_verl.probe.batch import make_probe_batch, validate_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.ground_truth import importance_weighted_entropies, sequence_entropy_stats
from treetune_verl.probe.mixed_probe import collective_device
from treetune_verl.probe.sampling import sample_responses

T = TypeVar("T")
PREFIX = "probe/"


def _sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """``values`` (fp64, CPU) summed over the default group (gloo: CPU; NCCL: on the current CUDA device)."""
    if world()[1] == 1:
        return values
    reduced = values.to(collective_device())
    torch.distributed.all_reduce(reduced)
    return reduced.cpu()


def _check_model(model: torch.nn.Module) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        raise NotImplementedError(
            "entropy forecast: the actor is FSDP1-wrapped; supported are actor_rollout_ref.actor.strategy=fsdp2 and "
            "an unwrapped module (E's responses are sampled through the module's own forward)"
        )


@contextlib.contextmanager
def weights_at(components: ProbeComponents, weights: dict[str, torch.Tensor]) -> Iterator[None]:
    """The parameters (this rank's shards) set to ``weights`` inside, and put back as they were on exit."""
    params = dict(components.named_params)
    with torch.no_grad():
        current = {name: local_tensor(params[name]).detach().clone() for name in weights}
        for name, value in weights.items():
            local_tensor(params[name]).copy_(value)
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in current.items():
                local_tensor(params[name]).copy_(value)


def _grad_dot(components: ProbeComponents, step: dict[str, torch.Tensor]) -> float:
    """⟨.grad, Δθ⟩ over this rank's shards (fp64); parameters without a gradient or a step add nothing."""
    total = 0.0
    for name, p in components.named_params:
        if p.grad is not None and name in step:
            total += float((local_tensor(p.grad).detach().double() * step[name].double()).sum())
    return total


def x_dots_and_entropies(
    comps: dict[str, ProbeComponents], E: dict[str, torch.Tensor], step: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Per prompt i of E: ⟨X_i, Δθ⟩ for every estimator (``[B]`` fp64 each, this rank's shard), and the sequence
    log-probabilities and summed entropies ``(S, F)`` (``[B, G]`` fp64) at θ, from one forward per prompt.

    Each prompt's teacher-forced pass (with entropies) feeds every estimator's surrogate loss in turn (one backward
    each, the graph kept between them), and the same values give the realised change's starting point. With
    ``residual_mu`` the baseline is read before the batch and updated after it (``ProbeComponents.x_surrogate``).
    """
    first = next(iter(comps.values()))
    B, _, P = validate_probe_batch(E, "E_batch")
    surrogates = {e: c.x_surrogate(E["sequences"].shape[-1] - P) for e, c in comps.items()}
    dots = {e: torch.zeros(B, dtype=torch.float64) for e in comps}
    S_parts, F_parts = [], []
    for i in range(B):
        prompt = {key: value[i : i + 1] for key, value in E.items()}
        for mb, tf in first.teacher_forced_microbatches(prompt, 1, True, "E_batch"):
            S_parts.append(tf.token_logprobs.detach().double().sum(-1).cpu())
            F_parts.append(tf.entropies.detach().double().sum(-1).cpu())
            for j, (estimator, (loss_fn, _)) in enumerate(surrogates.items()):
                loss_fn({"tf": tf, **mb}).backward(retain_graph=j < len(surrogates) - 1)
                dots[estimator][i] = _grad_dot(first, step)
                for p in first.params:
                    p.grad = None
    for _, finish in surrogates.values():
        finish()
    return dots, (torch.cat(S_parts), torch.cat(F_parts))


def _entropy_sums(components: ProbeComponents, E: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S, F)`` at the current weights; a sampled token that left the nucleus has probability 0."""
    return sequence_entropy_stats(components, E, 1, allow_zero_probability=True)


def realised_change(
    before: tuple[torch.Tensor, torch.Tensor], after: tuple[torch.Tensor, torch.Tensor], budget: torch.Tensor
) -> tuple[float, float]:
    """(ΔĤ over all ranks' prompts, Ĥ before), nats per budget token, from ``sequence_entropy_stats`` at θ and θ′."""
    h_before, h_after, _ = importance_weighted_entropies(*before, *after)
    per_prompt = torch.stack(
        [
            ((h_after - h_before) / budget).sum(),
            (h_before / budget).sum(),
            torch.tensor(len(budget), dtype=torch.float64),
        ]
    )
    total = _sum_over_ranks(per_prompt.double())
    return float(total[0] / total[2]), float(total[1] / total[2])


@dataclass
class ForecastState:
    """Per-actor state kept across probed updates: one ``ProbeComponents`` per estimator (the RB baseline stays warm)."""

    components: dict[str, ProbeComponents] = field(default_factory=dict)
    temperature: float | None = None
    calls: int = 0  # update_actor calls seen (worker_hook's every-k count)
    last_eval: dict[str, torch.Tensor] | None = None  # this rank's E of the last forecast (a probe batch)

    def components_for(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: ForecastSettings, temperature: float
    ) -> dict[str, ProbeComponents]:
        if self.temperature != temperature or not self.components:
            self.components = {
                e: ProbeComponents(model, settings.probe_config(e, temperature), optimizer) for e in settings.estimators
            }
            self.temperature = temperature
        return self.components


def sample_eval_batch(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    G: int,
    budget: int,
    temperature: float,
    top_p: float,
    pad_token_id: int,
    eos_token_ids: list[int],
    seed: int,
) -> dict[str, torch.Tensor]:
    """E: G fresh responses per prompt from the model at its current weights, as a probe batch with L_max = budget.

    Every rank runs all ``budget`` decoding steps (``stop_early=False``): FSDP's forwards must stay in lockstep.
    """
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    responses, _ = sample_responses(
        model, prompt_ids, G, temperature, top_p, budget, pad_token_id, eos_token_ids, generator, stop_early=False
    )
    B = len(prompt_ids)
    return make_probe_batch(prompt_ids, responses, torch.zeros(B, G), pad_token_id, [budget] * B)


def optimizer_steps(actor: Any, rows: int) -> int:
    """Optimizer steps of verl's ``update_policy`` on ``rows`` rows: one per mini-batch
    (``data.split(ppo_mini_batch_size)``, also with dynamic batch sizes), repeated ``ppo_epochs`` times."""
    return math.ceil(rows / int(actor.config.ppo_mini_batch_size)) * int(actor.config.ppo_epochs)


def forecast_update(
    actor: Any,
    data: Any,
    settings: ForecastSettings,
    state: ForecastState,
    rollout_n: int,
    eos_token_ids: list[int],
    update: Callable[[], T],
) -> tuple[T, dict[str, float]]:
    """Run ``update()`` (verl's update of ``actor`` on ``data``) with the forecast at its first optimizer step;
    return its result and the ``probe/*`` and ``timing_s/probe`` metrics (the same on every rank).

    Args:
        actor: verl's ``DataParallelPPOActor``: ``actor_module`` (FSDP-wrapped model), ``actor_optimizer``,
            ``config.grad_clip`` / ``ppo_mini_batch_size`` / ``ppo_epochs``.
        data: the ``DataProto`` this rank trains on (``meta_info["temperature"]``, ``non_tensor_batch["uid"]``).
        rollout_n: responses per prompt of E (verl's ``rollout.n``).
        eos_token_ids: end E's sampled responses.
        update: runs the update; it must call ``actor._optimizer_step`` (looked up on the instance).
    """
    start = time.perf_counter()
    model, optimizer = actor.actor_module, actor.actor_optimizer
    _check_model(model)
    temperature = float(data.meta_info["temperature"])
    comps = state.components_for(model, optimizer, settings, temperature)
    steps = optimizer_steps(actor, len(data))
    prompts = eval_prompts(data)
    rank, _ = world()
    seed = (settings.seed * 1_000_003 + state.calls) * 1_009 + rank  # fresh, independent samples per step and rank
    E = sample_eval_batch(
        model,
        prompts.prompt_ids,
        rollout_n,
        int(data.batch["responses"].shape[1]),
        temperature,
        settings.top_p,
        int(data.meta_info.get("pad_token_id", 0)),
        eos_token_ids,
        seed,
    )
    state.last_eval = E
    sample_s = time.perf_counter() - start
    first = next(iter(comps.values()))
    sharded = any(is_sharded(p) for p in first.params)
    budget = E["max_lengths"].double()
    metrics: dict[str, float] = {}
    probe_s = 0.0  # the forecast's seconds inside update() (its first optimizer step)
    before: list[tuple[torch.Tensor, torch.Tensor]] = []

    own = vars(actor)
    had_own_step = "_optimizer_step" in own
    previous_own_step = own.get("_optimizer_step")
    verl_step = actor._optimizer_step

    def _first_step(verl_step: Callable[[], Any]) -> Any:
        """verl's first optimizer step, then the forecast of it at the weights it started from."""
        theta = {name: local_tensor(p).detach().clone() for name, p in first.named_params}  # θ, this rank's shards
        grad_norm = verl_step()  # verl's clipping and optimizer step: θ -> θ'
        step = {name: local_tensor(p).detach() - theta[name] for name, p in first.named_params}  # Δθ, exact in fp32
        step_sq = torch.tensor([sum(float(t.double().pow(2).sum()) for t in step.values())], dtype=torch.float64)
        metrics[PREFIX + "step_norm"] = float((_sum_over_ranks(step_sq) if sharded else step_sq).sqrt())
        with weights_at(first, theta):  # back at θ for X and Ĥ(θ); θ' again afterwards
            dots, stats_before = x_dots_and_entropies(comps, E, step)
        before.append(stats_before)
        for estimator, per_prompt in dots.items():
            per_prompt = _sum_over_ranks(per_prompt) if sharded else per_prompt
            metrics[f"{PREFIX}deltaH1/{estimator}"] = float(per_prompt.mean())
            if per_prompt.numel() > 1:
                metrics[f"{PREFIX}deltaH1_se/{estimator}"] = float(per_prompt.std() / math.sqrt(per_prompt.numel()))
        return grad_norm

    calls = 0

    def _optimizer_step():
        nonlocal calls, probe_s
        calls += 1
        if calls > 1:
            return verl_step()
        start = time.perf_counter()
        step_start: list[float] = []

        def timed_verl_step() -> Any:
            step_start.append(time.perf_counter())
            result = verl_step()
            step_start.append(time.perf_counter())
            return result

        grad_norm = _first_step(timed_verl_step)
        if steps > 1:
            change, _ = realised_change(before[0], _entropy_sums(first, E), budget)
            metrics[PREFIX + "deltaH_realised_first_step"] = change
        probe_s += time.perf_counter() - start - (step_start[1] - step_start[0])  # verl's own step is the update's
        return grad_norm

    actor._optimizer_step = _optimizer_step
    start = time.perf_counter()
    try:
        result = update()
    finally:
        if had_own_step:
            actor._optimizer_step = previous_own_step
        else:
            del actor._optimizer_step
    update_s = time.perf_counter() - start - probe_s
    probe_s += sample_s
    if calls == 0:
        raise RuntimeError(
            "entropy forecast: verl's update took no optimizer step (DataParallelPPOActor._optimizer_step never called)"
        )
    start = time.perf_counter()
    change, h_before = realised_change(before[0], _entropy_sums(first, E), budget)
    probe_s += time.perf_counter() - start
    metrics[PREFIX + "deltaH_realised"] = change
    metrics.setdefault(PREFIX + "deltaH_realised_first_step", change)
    metrics[PREFIX + "H_before"] = h_before
    metrics[PREFIX + "optimizer_steps"] = float(calls)
    metrics[PREFIX + "eval_prompts"] = float(prompts.total - prompts.left_out)
    metrics[PREFIX + "sample_s"] = sample_s
    metrics[PREFIX + "update_s"] = update_s
    metrics["timing_s/probe"] = probe_s
    metrics[PREFIX + "cost_ratio"] = probe_s / update_s if update_s > 0 else float("nan")
    return result, metrics
