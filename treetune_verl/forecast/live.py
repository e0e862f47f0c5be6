# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""One forecast around verl's actor update: ΔH₁ of its first optimizer step, and the realised entropy change.

Shape notation (this rank): B = prompts of E, G = responses per prompt (``rollout.n``), W = data-parallel ranks,
R = the response budget (``data.max_response_length``). Units: nats per budget token (H_seq / R, the probe's target
with L_max = R fixed, so its normalised estimators are unbiased).

E = the prompts of the batch verl is about to train on with G fresh responses each, sampled at θ before anything
moves: by the rollout's sglang servers with the step's rollout when our manager ran it (``rollout_eval.py``, handed
over in the batch's ``meta_info``), else here from the actor with HF-style decoding (``verl_batch.py``,
``sample_eval_batch``); U = the batch itself, through verl's own loss. At the update's first optimizer
step (``DataParallelPPOActor._optimizer_step``, once per mini-batch; the first one holds verl's gradient of the first
mini-batch at θ):

    Δθ        = the step verl takes there (its clipping, its optimizer and state): θ′ − θ read from the weights
                (this rank's shards; the difference of two nearby float32 values is exact)
    ΔH₁[e]    = mean_b ⟨X_b, Δθ⟩ for each X estimator e (naive, rb_residual) on E at θ (``directional.py``): by the
                chain rule through E's per-token values and a central difference along Δθ, three forwards over E at
                θ′, θ and θ − Δθ, none with a graph, when the actor computes in float32; below it (bf16 mixed
                precision) one forward with graph per prompt and one backward per estimator (``settings.method``);
                ``deltaH1_se`` = the standard error over the prompts
    realised  = Ĥ(θ′) − Ĥ(θ) on E's responses (importance weights with a leave-one-out control variate,
                ``probe/ground_truth.py``) from the same forwards at θ and θ′ (``deltaH_realised_first_step``), and
                after the whole update, all mini-batches and epochs (``deltaH_realised``, one more forward when the
                update took more than one optimizer step); ``deltaH_realised_ess_min`` the smallest effective
                sample size of its weights (out of G)

and, from the same forwards, the forecast of E's token entropy, ``probe/token/*`` (``token_entropy.py``, nats per
token): its tangent along Δθ at E's states, the realised change at the same states (no importance weights), the
on-policy forecast with the shift of the states' distribution, and a held-out pair for calibration. That is the
forecast the early warning reads and the study judges (``treetune_specs/2026-11-28-forecast-calibration.md``): on a
collapsing SmolLM2 run the sequence-level ΔH₁'s standard error was 6-30× the change and the importance weights of
the realised change spread over exp(±2) per sequence.

The weights are moved with one copy of this rank's shards (``step_weights.py``) and put back to θ′ bit for bit
before verl goes on. ΔH₁ uses nothing of θ′ but Δθ, the same Δθ a dry run of the optimizer would give
(``probe/optimizer_step.py``), which for a 135M-parameter AdamW costs a float64 copy of parameters and state (measured
20-90 s per step on the shared 2-core machine, more than the update itself). The forecast needs no Y pass: Δθ comes
from verl's gradient (PPO clip at ratio 1 on the first mini-batch, its aggregation, KL and entropy terms if on). E's
samples are independent of U's, so ⟨X̄, Δθ⟩ is unbiased for ⟨∇H, Δθ⟩ and the importance-weighted realised change is
unbiased too (θ′ depends on U only).

Each forecast's metrics also go through the run's early warning (``early_warning.py``, kept in ``ForecastState``
across updates): the entropy's projection to a floor and the forecast/realised disagreement, ``probe/warning/*``.

FSDP2: Δθ is over this rank's shards (``sharding.py``); every forward sees the whole model (FSDP gathers the shards),
so each rank's central-difference ⟨X_b, Δθ⟩ is whole for its own prompts, and the mean and standard error are over
all W·B prompts. A backward's gradient is averaged over the ranks instead, so the backward method's shard inner
products, summed over ranks, give per prompt index the mean over ranks (standard error over the B indices). Every
rank holds the same number of prompts and runs the same number of forwards and backwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from treetune_verl.batch_keys import FORECAST_EVAL_META_KEY
from treetune_verl.forecast.directional import (
    PATHWISE,
    compute_dtype,
    dots_from_coefficients,
    sequence_sums,
    token_values,
    x_coefficients,
    x_directional_derivatives_by_backward,
)
from treetune_verl.forecast.early_warning import EarlyWarning, WarningSettings
from treetune_verl.forecast.record import values, write_record
from treetune_verl.forecast.rollout_eval import EvalResponses
from treetune_verl.forecast.settings import SECTION, ForecastSettings, forecast_settings
from treetune_verl.forecast.sharding import is_sharded, reshard
from treetune_verl.forecast.softmax_tangent import SoftmaxTangent, per_position
from treetune_verl.forecast.step_weights import WeightsAroundStep
from treetune_verl.forecast.token_entropy import TokenEntropyStats, response_sums
from treetune_verl.forecast.verl_batch import EvalPrompts, eval_prompts, prompts_by_uid, rollout_eval_share, world
from treetune_verl.patching import swapped
from treetune_verl.probe.batch import make_probe_batch
from treetune_verl.probe.components import ProbeComponents
from treetune_verl.probe.ground_truth import importance_weighted_entropies
from treetune_verl.probe.mixed_probe import collective_device
from treetune_verl.probe.sampling import sample_responses
from treetune_verl.probe.teacher_forcing import TeacherForced

T = TypeVar("T")
PREFIX = "probe/"
CONTROL_SECONDS, CONTROL_COST_RATIO = "control/seconds", "control/cost_ratio"  # beside the controller's control/*
TOKEN_PREFIX = "probe/token/"  # E's token entropy: the calibrated forecast (token_entropy.py)
STATE_ATTR = "_treetune_entropy_forecast"  # on verl's actor worker: its ForecastState across updates
SETTINGS_ATTR = "_treetune_forecast_settings"  # the forecast's settings, read at the worker's first update
PROBE_TIMING = "timing_s/probe"  # the forecast's seconds, beside verl's timing_s/*


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


def realised_change(
    before: tuple[torch.Tensor, torch.Tensor], after: tuple[torch.Tensor, torch.Tensor], budget: torch.Tensor
) -> tuple[float, float, float]:
    """(ΔĤ, its standard error, Ĥ before) over all ranks' prompts, nats per budget token, from ``(S, F)`` at θ and
    θ′ (``directional.sequence_sums``)."""
    h_before, h_after, _ = importance_weighted_entropies(*before, *after)
    change, se = mean_and_se((h_after - h_before) / budget)
    h, _ = mean_and_se(h_before / budget)
    return change, se, h


def mean_and_se(per_prompt: torch.Tensor) -> tuple[float, float]:
    """Mean and standard error over all ranks' prompts of a ``[B]`` per-prompt value (SE nan for one prompt)."""
    x = per_prompt.double()
    sums = torch.stack([torch.tensor(float(len(x)), dtype=torch.float64), x.sum(), (x * x).sum()])
    n, total, squares = (float(v) for v in _sum_over_ranks(sums))
    mean = total / n
    if n < 2:
        return mean, float("nan")
    return mean, math.sqrt(max(squares - n * mean * mean, 0.0) / (n - 1) / n)


@dataclass
class ForecastState:
    """Per-actor state kept across probed updates: one ``ProbeComponents`` per estimator (the RB baseline stays warm)."""

    components: dict[str, ProbeComponents] = field(default_factory=dict)
    temperature: float | None = None
    calls: int = 0  # update_actor calls seen (the update_actor seam's every-k count)
    last_eval: dict[str, torch.Tensor] | None = None  # this rank's E of the last forecast (a probe batch)
    early_warning: EarlyWarning | None = None  # the projection and warnings across forecasts
    # entropy control (``control/controller.py``), set by the actor seams when ``custom.entropy_control`` is on: called
    # at the first optimizer step (``after_verl_step``, ``decide_and_apply``), ``moved`` when it changed the weights
    controller: Any = None

    def due(self, every: int, marked: bool, rollout_eval: Any) -> bool:
        """Whether this update is forecast: the rollout's say when it marked the batch (``marked``: ``rollout_eval``
        E, or None for a step without), else every ``every``-th call (1, 1 + k, ...; a resumed run counts from its
        first step again)."""
        if marked:
            return rollout_eval is not None
        return (self.calls - 1) % every == 0

    def warning(self, settings: WarningSettings) -> EarlyWarning:
        """The run's :class:`EarlyWarning` (a new one when the settings changed)."""
        if self.early_warning is None or self.early_warning.settings != settings:
            self.early_warning = EarlyWarning(settings)
        return self.early_warning

    def components_for(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: ForecastSettings, temperature: float
    ) -> dict[str, ProbeComponents]:
        if self.temperature != temperature or not self.components:
            # The sharded parameters (the optimizer's): FSDP2 registers the gathered ones on a module between a
            # forward and its reshard (the root keeps them after a forward without backward, e.g. verl's
            # compute_log_prob), and those are freed at the next reshard.
            reshard(model)
            self.components = {
                e: ProbeComponents(model, settings.probe_config(e, temperature), optimizer) for e in settings.estimators
            }
            self.temperature = temperature
        return self.components


def counted_call(worker: Any) -> tuple[ForecastSettings, ForecastState] | None:
    """For one ``update_actor`` call of verl's actor ``worker``: the forecast's settings and its state across updates
    (kept on the worker, this call counted); None when the forecast is off.

    The settings are read from the worker's ``config.rollout`` at its first call and kept (the trainer's process
    checked the same section at start-up, before any worker existed; an actor runs one run's config)."""
    if SETTINGS_ATTR not in vars(worker):
        vars(worker)[SETTINGS_ATTR] = forecast_settings(worker.config.rollout)
    settings = vars(worker)[SETTINGS_ATTR]
    if settings is None:
        return None
    state = vars(worker).setdefault(STATE_ATTR, ForecastState())
    state.calls += 1
    return settings, state


def sample_eval_batch(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    G: int,
    budget: int,
    temperature: float,
    pad_token_id: int,
    eos_token_ids: list[int],
    seed: int,
) -> dict[str, torch.Tensor]:
    """E: G fresh responses per prompt from the model at its current weights, as a probe batch with L_max = budget.

    Every rank runs all ``budget`` decoding steps (``stop_early=False``): FSDP's forwards must stay in lockstep.
    """
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    responses, _ = sample_responses(
        model, prompt_ids, G, temperature, 1.0, budget, pad_token_id, eos_token_ids, generator, stop_early=False
    )
    B = len(prompt_ids)
    return make_probe_batch(prompt_ids, responses, torch.zeros(B, G), pad_token_id, [budget] * B)


def _min_over_ranks(value: torch.Tensor) -> float:
    """The smallest of a scalar over the ranks."""
    reduced = value.double().reshape(1)
    if world()[1] > 1:
        reduced = reduced.to(collective_device())
        torch.distributed.all_reduce(reduced, op=torch.distributed.ReduceOp.MIN)
    return float(reduced.cpu())


def _token_stats_by_index(at_theta: TeacherForced, plus: TeacherForced, pathwise: torch.Tensor) -> TokenEntropyStats:
    """E's token-entropy sums with backward passes: units = prompt indices, every rank's prompt of an index summed
    (a backward's gradient is averaged over the W ranks, so W times the rank-summed ``pathwise`` shard inner products
    is the index's summed tangent)."""
    tokens, h0 = response_sums(at_theta)
    _, h1 = response_sums(plus)
    summed = _sum_over_ranks(torch.stack([tokens.sum(-1), h0.sum(-1), h1.sum(-1)]))
    tangent = _sum_over_ranks(pathwise) * world()[1]
    return TokenEntropyStats(summed[0], summed[1], tangent, summed[2] - summed[1])


def _index_mean_and_se(per_index: torch.Tensor) -> tuple[float, float]:
    """Mean and standard error over the prompt indices of a ``[B]`` value already reduced over ranks."""
    if len(per_index) < 2:
        return float(per_index.mean()), float("nan")
    return float(per_index.mean()), float(per_index.std() / math.sqrt(len(per_index)))


def use_backward(method: str, model: torch.nn.Module) -> bool:
    """Whether ``method`` (the block's ``method``) takes ⟨X_b, Δθ⟩ by backward passes for this model.

    Raises:
        ValueError: ``central_difference`` on a model that computes below float32.
    """
    dtype = compute_dtype(model)
    low_precision = dtype not in (torch.float32, torch.float64)
    if method == "central_difference" and low_precision:
        raise ValueError(
            f"{SECTION}.method=central_difference: the actor computes in {dtype}, where a step's "
            "central difference measures rounding flips, not the derivative; use method=auto or backward"
        )
    return method == "backward" or (method == "auto" and low_precision)


@dataclass(frozen=True)
class ActorView:
    """What a forecast uses of verl's actor, whichever worker holds it.

    Attributes:
        module: the policy verl's optimizer steps (FSDP2-wrapped or plain).
        optimizer: verl's optimizer of ``module``.
        rows_per_forward: rows per forward over E (verl's micro-batch of rows).
        step_owner, step_name: where verl's optimizer step (no argument) is looked up at call time, for
            :meth:`ForecastRun.around` (verl 0.7.1: ``DataParallelPPOActor._optimizer_step``).
    """

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rows_per_forward: int
    step_owner: Any
    step_name: str


@dataclass(frozen=True)
class UpdateInputs:
    """What a forecast reads of the batch verl is about to train on.

    Attributes:
        temperature: the rollout's sampling temperature (E's responses and every forward over them).
        pad_token_id: pads E's probe batch.
        rollout_eval: E as the rollout sampled it (every rank gets all of it), or None: E sampled here.
        eval_prompts: without ``rollout_eval``, this rank's share of E's prompts (a collective over the ranks:
            called once on every rank).
        response_width: R, E's response budget when sampled here.
    """

    temperature: float
    pad_token_id: int
    rollout_eval: EvalResponses | None
    eval_prompts: Callable[[], EvalPrompts] | None = None
    response_width: int | None = None


def rows_per_forward(micro_batch_rows: int | None, max_token_len: int | None, width: int) -> int:
    """verl's micro-batch of rows: ``micro_batch_rows``, or with dynamic batch sizes (no row count) the token budget
    ``max_token_len`` // the row width ``width``; at least one. verl 0.7.1's actor names them
    ``ppo_micro_batch_size_per_gpu`` / ``ppo_max_token_len_per_gpu``, verl 0.9.1's engine ``micro_batch_size_per_gpu`` /
    ``max_token_len_per_gpu``."""
    rows = micro_batch_rows or int(max_token_len) // width
    return max(1, int(rows))


def eos_token_ids(generation_config: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence ids of the policy: its generation config's (may be None), else its tokenizer's."""
    eos = getattr(generation_config, "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos
    return list(eos) if isinstance(eos, list | tuple) else [eos]


def prompts_per_forward(rows: int, G: int) -> int:
    """Prompts per forward over E, G rows each, within ``rows`` rows per forward; at least one."""
    return max(1, rows // G)


class ForecastRun:
    """The forecast around one verl update: E taken or sampled at construction (θ, before anything moves), ΔH₁ at
    the update's first optimizer step (:meth:`optimizer_step`), the realised change in :meth:`finish`.

    The caller routes verl's optimizer step through :meth:`optimizer_step` for the duration of the update: the
    actor seam (``treetune_verl/verl/v0_7_1/actor_seams.py``) in verl's trainer, :meth:`around` elsewhere. Built from
    verl 0.7.1's actor and batch by :meth:`from_dp_actor`.

    E is the rollout's (``inputs.rollout_eval``) when given, else sampled here (``probe/sample_s``).

    Args:
        actor: the model, optimizer and micro-batch the forecast uses.
        inputs: the update's temperature, padding and E (or where to sample it from).
        rollout_n: responses per prompt of E (verl's ``rollout.n``).
        eos_token_ids: end E's sampled responses.
    """

    def __init__(
        self,
        actor: ActorView,
        inputs: UpdateInputs,
        settings: ForecastSettings,
        state: ForecastState,
        rollout_n: int,
        eos_token_ids: list[int],
    ) -> None:
        start = time.perf_counter()
        self._actor = actor
        self._warning = state.warning(settings.early_warning)
        model = actor.module
        _check_model(model)
        self._by_backward = use_backward(settings.method, model)
        self._control = state.controller
        if self._control is not None and self._by_backward:
            raise ValueError(
                "entropy control measures its step by central differences: it needs the forecast's float32 forwards "
                f"(entropy_forecast.method auto with a float32 actor, or central_difference; got {settings.method!r})"
            )
        self._comps = state.components_for(model, actor.optimizer, settings, inputs.temperature)
        self._first = next(iter(self._comps.values()))
        self._sample_s = 0.0  # sampling E here (none when the rollout sampled it)
        if inputs.rollout_eval is not None:
            self._prompts, self._E = rollout_eval_share(inputs.rollout_eval, inputs.pad_token_id)
        else:
            if inputs.eval_prompts is None or inputs.response_width is None:
                raise ValueError("entropy forecast: no E from the rollout, and no prompts or budget to sample it")
            sample_start = time.perf_counter()
            self._prompts = inputs.eval_prompts()
            seed = (settings.seed * 1_000_003 + state.calls) * 1_009 + world()[0]  # fresh samples per step and rank
            self._E = sample_eval_batch(
                model,
                self._prompts.prompt_ids,
                rollout_n,
                inputs.response_width,
                inputs.temperature,
                inputs.pad_token_id,
                eos_token_ids,
                seed,
            )
            self._sample_s = time.perf_counter() - sample_start
        state.last_eval = self._E
        self._sharded = any(is_sharded(p) for p in self._first.params)
        self._mb_prompts = prompts_per_forward(actor.rows_per_forward, rollout_n)
        self._budget = self._E["max_lengths"].double()
        self._metrics: dict[str, float] = {}
        self._stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # (S, F) of E at θ and θ′ (first step)
        self._steps = 0
        self._record_dir, self._call = settings.record_dir, state.calls
        self._record: dict[str, Any] | None = None  # E's token values, written by finish() with record_dir
        now = time.perf_counter()
        self._setup_s, self._probe_s, self._update_start = now - start, 0.0, now
        self._control_s = 0.0  # the controller's own seconds, inside the forecast's (probe_s)

    @classmethod
    def from_dp_actor(
        cls,
        actor: Any,
        data: Any,
        settings: ForecastSettings,
        state: ForecastState,
        rollout_n: int,
        eos_token_ids: list[int],
    ) -> ForecastRun:
        """The forecast around verl 0.7.1's ``DataParallelPPOActor.update_policy(data)``.

        Args:
            actor: ``actor_module`` (FSDP2-wrapped model), ``actor_optimizer``, ``config.ppo_micro_batch_size_per_gpu``
                (or ``ppo_max_token_len_per_gpu``), ``_optimizer_step``.
            data: the ``DataProto`` this rank trains on (``meta_info["temperature"]``, ``["pad_token_id"]``, the
                rollout's E under ``FORECAST_EVAL_META_KEY``; ``non_tensor_batch["uid"]`` to sample E here).
        """
        width = int(data.batch["input_ids"].shape[1])
        view = ActorView(
            actor.actor_module,
            actor.actor_optimizer,
            rows_per_forward(actor.config.ppo_micro_batch_size_per_gpu, actor.config.ppo_max_token_len_per_gpu, width),
            actor,
            "_optimizer_step",
        )
        inputs = UpdateInputs(
            temperature=float(data.meta_info["temperature"]),
            pad_token_id=int(data.meta_info.get("pad_token_id", 0)),
            rollout_eval=data.meta_info.get(FORECAST_EVAL_META_KEY),
            eval_prompts=lambda: eval_prompts(prompts_by_uid(data), settings.eval_uids),
            response_width=int(data.batch["responses"].shape[1]),
        )
        return cls(view, inputs, settings, state, rollout_n, eos_token_ids)

    def optimizer_step(self, verl_step: Callable[[], Any]) -> Any:
        """verl's optimizer step; at the first one, the forecast of it (its time is the forecast's, not verl's)."""
        self._steps += 1
        if self._steps > 1:
            return verl_step()
        start, step_s = time.perf_counter(), 0.0

        def timed_verl_step() -> Any:
            nonlocal step_s
            step_start = time.perf_counter()
            result = verl_step()
            step_s = time.perf_counter() - step_start
            return result

        grad_norm = self._first_step(timed_verl_step)
        self._probe_s += time.perf_counter() - start - step_s
        return grad_norm

    def _first_step(self, verl_step: Callable[[], Any]) -> Any:
        """verl's first optimizer step θ -> θ′, then ⟨X_b, Δθ⟩ from the weights it started at."""
        first, E, mb = self._first, self._E, self._mb_prompts
        weights = WeightsAroundStep(first)  # a copy of θ, this rank's shards
        grad_norm = verl_step()
        if self._control is not None:
            self._control.after_verl_step(self._actor.optimizer)  # while .grad holds the step's gradient
        central = not self._by_backward  # the central difference's forwards also give the forecast exact in the softmax
        plus = token_values(first, E, mb, keep_log_probs=central)  # at θ′ = θ + Δθ
        try:
            step_sq = torch.tensor([weights.swap()], dtype=torch.float64)  # parameters at θ
            if self._by_backward:
                dots, at_theta = x_directional_derivatives_by_backward(self._comps, E, weights.step)
            else:
                softmax = SoftmaxTangent(plus.log_probs)
                plus.log_probs = None
                at_theta = token_values(first, E, mb, keep_log_probs=True)
                softmax.add_theta(at_theta.log_probs)
                at_theta.log_probs = None
                weights.minus_step()
                minus = token_values(first, E, mb, keep_log_probs=True)
                softmax_change = per_position(softmax.changes(minus.log_probs), at_theta.response_mask)
                minus.log_probs = None
        finally:
            weights.restore()  # θ′ exactly, as verl's step left it
        if not self._by_backward:
            coefficients = x_coefficients(self._comps, E, at_theta)
            dots = dots_from_coefficients(coefficients, plus, minus)
            if self._record_dir is not None:
                self._record = {
                    "E": {k: v.cpu() for k, v in E.items()},
                    "mask": at_theta.response_mask.cpu(),
                    "budget": self._budget.clone(),
                    "theta": values(at_theta),
                    "plus": values(plus),
                    "minus": values(minus),
                    "softmax": {"change": softmax_change.clone()},
                    "coefficients": {e: {"lp": c[0].double(), "H": c[1].double()} for e, c in coefficients.items()},
                }
        self._metrics[PREFIX + "step_norm"] = float((_sum_over_ranks(step_sq) if self._sharded else step_sq).sqrt())
        self._stats["before"], self._stats["first_step"] = sequence_sums(at_theta), sequence_sums(plus)
        if self._by_backward:
            self._token = _token_stats_by_index(at_theta, plus, dots.pop(PATHWISE))
        else:
            self._token = TokenEntropyStats.per_response(at_theta, plus, minus, softmax_change)
        if self._control is not None:  # θ′ restored: the controller's step goes on top of verl's
            control_start, step_norm = time.perf_counter(), self._metrics[PREFIX + "step_norm"]
            self._metrics.update(self._control.decide_and_apply(first, E, mb, self._token, step_norm, _sum_over_ranks))
            self._control_s += time.perf_counter() - control_start
        for estimator, per_prompt in dots.items():
            # by backward: this rank's shard sums, whose sum over ranks is per prompt index the mean over ranks
            if self._by_backward:
                mean, se = _index_mean_and_se(_sum_over_ranks(per_prompt))
            else:
                mean, se = mean_and_se(per_prompt)
            self._metrics[f"{PREFIX}deltaH1/{estimator}"] = mean
            if math.isfinite(se):
                self._metrics[f"{PREFIX}deltaH1_se/{estimator}"] = se
        return grad_norm

    def _token_change(self, after: TeacherForced) -> torch.Tensor:
        """Per unit of ``self._token``, E's summed token entropy after the whole update minus at θ."""
        _, h_after = response_sums(after)
        if not self._by_backward:
            return h_after.flatten() - self._token.h_before
        return _sum_over_ranks(h_after.sum(-1)) - self._token.h_before

    def around(self, update: Callable[[], T]) -> tuple[T, dict[str, float]]:
        """Run ``update()`` (verl's update of the actor; it must call the optimizer step the ``ActorView`` names,
        looked up on its owner) with this forecast, then :meth:`finish`: its result and the forecast's metrics.
        Outside verl's trainer (tests, benchmarks); in it, the actor seam does the same around ``update_policy``."""
        owner, name = self._actor.step_owner, self._actor.step_name
        verl_step = getattr(owner, name)
        with swapped(owner, name, lambda: self.optimizer_step(verl_step)):
            result = update()
        return result, self.finish()

    def finish(self) -> dict[str, float]:
        """After verl's update: the realised change and the ``probe/*`` and ``timing_s/probe`` metrics (the same on
        every rank)."""
        update_s = time.perf_counter() - self._update_start - self._probe_s
        if self._steps == 0:
            raise RuntimeError(
                "entropy forecast: verl's update took no optimizer step "
                f"({type(self._actor.step_owner).__name__}.{self._actor.step_name} never called)"
            )
        start = time.perf_counter()
        before, budget = self._stats["before"], self._budget
        first_step, first_step_se, h_before = realised_change(before, self._stats["first_step"], budget)
        self._ess_min = _min_over_ranks(importance_weighted_entropies(*before, *self._stats["first_step"])[2].min())
        change, change_se = first_step, first_step_se  # one optimizer step: the whole update is the first step
        token_after = None  # per unit, E's summed token entropy change after the whole update
        if self._steps > 1 or (self._control is not None and self._control.moved):
            # the whole update moved past θ′: more optimizer steps, or the controller's step on top of verl's
            after_start = time.perf_counter()
            after_values = token_values(self._first, self._E, self._mb_prompts)
            after = sequence_sums(after_values)
            change, change_se, _ = realised_change(before, after, budget)
            token_after = self._token_change(after_values)
            if self._control is not None:
                self._metrics.update(self._control.realised(response_sums(after_values), _sum_over_ranks))
                if self._steps == 1:  # E's forwards after the update are there for the controller's step alone
                    self._control_s += time.perf_counter() - after_start
            if self._record is not None:
                self._record["after"] = values(after_values)
        probe_s = self._probe_s + self._setup_s + time.perf_counter() - start
        metrics = self._metrics
        metrics[PREFIX + "deltaH_realised"] = change
        metrics[PREFIX + "deltaH_realised_first_step"] = first_step
        if math.isfinite(change_se):
            metrics[PREFIX + "deltaH_realised_se"] = change_se
            metrics[PREFIX + "deltaH_realised_first_step_se"] = first_step_se
        metrics[PREFIX + "H_before"] = h_before
        metrics[PREFIX + "deltaH_realised_ess_min"] = self._ess_min
        reduce = _sum_over_ranks if not self._by_backward else (lambda t: t)  # by backward: already every rank's
        metrics.update(self._token.metrics(TOKEN_PREFIX, token_after, reduce))
        metrics[PREFIX + "optimizer_steps"] = float(self._steps)
        metrics[PREFIX + "eval_prompts"] = float(self._prompts.total - self._prompts.left_out)
        metrics[PREFIX + "sample_s"] = self._sample_s
        metrics[PREFIX + "update_s"] = update_s
        metrics[PROBE_TIMING] = probe_s
        metrics[PREFIX + "cost_ratio"] = probe_s / update_s if update_s > 0 else float("nan")
        if self._control is not None:
            # issue 46's cost: the controller's seconds over the update's, the forecast's included
            metrics[CONTROL_SECONDS] = self._control_s
            metrics[CONTROL_COST_RATIO] = self._control_s / (update_s + probe_s)
        metrics.update(self._warning.observe(metrics, log=world()[0] == 0))  # the same on every rank; rank 0 logs
        if self._record is not None:
            write_record(self._record_dir, self._call, world()[0], {**self._record, "metrics": dict(metrics)})
        return metrics
