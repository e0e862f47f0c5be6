# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Ground truth for ΔH₁: take the real optimizer step on U, measure the entropy change on E's prompts, restore.

Shape notation:
    b = prompts of an E batch, G = responses per prompt
    F[b, g] = Σ_k H_k(s_k) along response g (nats per sequence);  S[b, g] = log π(y_g | x_b)

Measured quantity: the probe's target H̄ = mean_b H_seq(x_b) / L_max(x_b) (or per sequence, without the division),
on E's prompts, before (θ) and after (θ′) the step. Both values are estimated on E's own responses, y_g ~ π_θ, with
common random numbers:

    Ĥ_b(θ)  = mean_g F_θ[b, g] / L_max(b)
    Ĥ_b(θ′) = mean_g [w_g F_θ′[b, g] − (w_g − 1) c_g] / L_max(b),   w_g = exp(S_θ′ − S_θ)[b, g],
              c_g = mean_{g′≠g} F_θ′[b, g′]   (0 when G = 1)

Plain importance weights make ``w_g F_θ′`` unbiased for E_θ′[F] at any G ≥ 1; the control variate ``(w_g − 1) c_g``
has expectation 0 (E_θ[w] = 1, and c_g depends only on the other, independent samples), so it takes the variance of
plain IS down to that of a leave-one-out baseline without adding bias. The self-normalised weights used before,
softmax_g(S_θ′ − S_θ), shrink the score-function part of the change by about (G − 1)/G (all of it at G = 1).

Why not fresh samples at θ′: they would bury a change of 1e-4 nats under O(1/sqrt(N)) noise; on the same responses
the noise of the difference is that of a directional-derivative estimate, and the estimate still includes every
higher-order and optimizer effect of the real step. Top-p: a sampled token that leaves the nucleus of θ′ has
probability 0 there (weight 0, not an error); tokens that enter the nucleus only at θ′ were never sampled at θ, a bias
of the size of their θ′ mass (zero at top_p = 1 and for small steps).

Snapshot/restore (``temporary_step``): trainable parameters are cloned and the optimizer state is deep-copied
before the step and copied back afterwards, so weights and optimizer state are bit-identical on return; ``.grad`` and
train/eval mode too. The optimizer-state warm-up (``optimizers.warm_up_optimizer_state``) uses the same context and
keeps the state.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator

import torch

from treetune_verl.probe.batch import iter_microbatches, validate_probe_batch
from treetune_verl.probe.components import ProbeComponents, probe_pass_context
from treetune_verl.probe.estimators import y_loss
from treetune_verl.probe.teacher_forcing import teacher_force

# Per-E-batch values of ``true_entropy_change``: nats per L_max token, except ``_per_sequence``; ESS out of G.
TRUTH_KEYS = ("deltaH_true", "deltaH_true_per_sequence", "H_before", "H_after", "min_ess")


@torch.no_grad()
def sequence_entropy_stats(
    components: ProbeComponents,
    batch: dict[str, torch.Tensor],
    mb_size_prompts: int,
    allow_zero_probability: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S, F)``: ``[B, G]`` fp64 CPU sequence log-probabilities and summed per-token entropies (nats).

    ``allow_zero_probability``: S = -inf for a response with a token outside the nucleus (else a ``ValueError``).
    """
    S_parts, F_parts = [], []
    for _, tf in components.teacher_forced_microbatches(
        batch, mb_size_prompts, True, "E_batch", allow_zero_probability
    ):
        S_parts.append(tf.token_logprobs.double().sum(-1).cpu())
        F_parts.append(tf.entropies.double().sum(-1).cpu())
    return torch.cat(S_parts), torch.cat(F_parts)


def importance_weighted_entropies(
    S_before: torch.Tensor, F_before: torch.Tensor, S_after: torch.Tensor, F_after: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-prompt estimates of E_θ[F] and E_θ′[F] from G responses y_g ~ π_θ (see the module docstring).

    Args:
        S_before, S_after: ``[B, G]`` sequence log-probabilities log π(y_g | x_b) at θ and θ′ (-inf at θ′ allowed).
        F_before, F_after: ``[B, G]`` summed per-token entropies along each response at θ and θ′ (nats).

    Returns:
        ``(h_before [B], h_after [B], ess [B])``: nats per sequence, unbiased for any G ≥ 1; ``ess`` =
        (Σ_g w_g)² / Σ_g w_g², the effective sample size of the weights out of G.
    """
    weights = torch.exp(S_after - S_before)  # [B, G]
    G = weights.shape[1]
    # [B, G] mean of F_after over the other responses; no control variate at G = 1
    leave_one_out = (F_after.sum(dim=1, keepdim=True) - F_after) / (G - 1) if G > 1 else torch.zeros_like(F_after)
    h_after = (weights * F_after - (weights - 1.0) * leave_one_out).mean(dim=1)
    ess = weights.sum(dim=1) ** 2 / (weights**2).sum(dim=1)
    return F_before.mean(dim=1), h_after, ess


def real_step(
    components: ProbeComponents,
    U_batch: dict[str, torch.Tensor],
    mb_size_prompts: int,
    optimizer: torch.optim.Optimizer,
) -> float:
    """One optimizer step minimising -J = -mean_b mean_g (A/L_max)·S over U (microbatched); returns seconds.

    The gradient is accumulated in ``.grad`` over microbatches (divided by B_U) and the optimizer steps once; run
    inside ``probe_pass_context`` (eval mode), the same policy as sampling. Leaves ``.grad`` populated.
    """
    B_U, _, P = validate_probe_batch(U_batch, "U_batch")
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    for mb in iter_microbatches(U_batch, mb_size_prompts):
        with components.autocast():
            tf = teacher_force(components.model, mb, P, components.temperature, components.top_p, False)
        loss = -y_loss(tf, mb["advantages"], mb["max_lengths"]) / B_U
        loss.backward()  # under DDP this all-reduces, as a real training step does
    optimizer.step()
    return time.perf_counter() - start


@contextlib.contextmanager
def temporary_step(
    components: ProbeComponents,
    U_batch: dict[str, torch.Tensor],
    mb_size_prompts: int,
    optimizer: torch.optim.Optimizer,
    keep_optimizer_state: bool = False,
) -> Iterator[float]:
    """``real_step`` on U on entry (yields its seconds), undone on exit.

    Every parameter the probe or ``optimizer`` holds is cloned before the step and copied back on exit
    (bit-identical); so is a deep copy of ``optimizer.state_dict()`` unless ``keep_optimizer_state``.
    """
    stepped = list(components.params)  # the optimizer may hold parameters the probe does not (frozen now, say)
    known = {id(p) for p in stepped}
    stepped += [p for group in optimizer.param_groups for p in group["params"] if id(p) not in known]
    param_snapshot = [p.detach().clone() for p in stepped]
    opt_snapshot = None if keep_optimizer_state else copy.deepcopy(optimizer.state_dict())
    try:
        with probe_pass_context(components.model, components.params):
            train_step_s = real_step(components, U_batch, mb_size_prompts, optimizer)
        yield train_step_s
    finally:
        with torch.no_grad():
            for p, saved in zip(stepped, param_snapshot, strict=True):
                p.copy_(saved)
        if opt_snapshot is not None:
            optimizer.load_state_dict(opt_snapshot)


def truth_of_batch(truth: dict[str, object], index: int) -> dict[str, float]:
    """The ``TRUTH_KEYS`` values of ``true_entropy_change``'s E batch number ``index``."""
    return {key: truth[key][index] for key in TRUTH_KEYS}


def true_entropy_change(
    components: ProbeComponents,
    E_batches: list[dict[str, torch.Tensor]],
    U_batch: dict[str, torch.Tensor],
    mb_size_prompts: int,
    optimizer: torch.optim.Optimizer | None,
    lr: float,
) -> dict[str, object]:
    """Real step on U (``optimizer``, else SGD(lr)), entropy change on each E batch, exact restore.

    Returns:
        dict with, per E batch (lists): ``deltaH_true`` and ``deltaH_true_per_sequence`` (nats per L_max token /
        per sequence), ``H_before``/``H_after`` (per L_max token), ``min_ess`` (smallest per-prompt effective sample
        size of the weights, out of G); and ``train_step_s``, ``ground_truth_s`` (seconds).
    """
    start = time.perf_counter()
    before = [sequence_entropy_stats(components, E, mb_size_prompts) for E in E_batches]
    opt = optimizer if optimizer is not None else torch.optim.SGD(components.params, lr=lr)
    with temporary_step(components, U_batch, mb_size_prompts, opt) as train_step_s:
        after = [sequence_entropy_stats(components, E, mb_size_prompts, True) for E in E_batches]

    out: dict[str, list[float]] = {key: [] for key in TRUTH_KEYS}
    for E, (S0, F0), (S1, F1) in zip(E_batches, before, after, strict=True):
        lmax = E["max_lengths"].double()  # [B]
        h0_seq, h1_seq, ess = importance_weighted_entropies(S0, F0, S1, F1)
        out["deltaH_true"].append(float(((h1_seq - h0_seq) / lmax).mean()))
        out["deltaH_true_per_sequence"].append(float((h1_seq - h0_seq).mean()))
        out["H_before"].append(float((h0_seq / lmax).mean()))
        out["H_after"].append(float((h1_seq / lmax).mean()))
        out["min_ess"].append(float(ess.min()))
    return {**out, "train_step_s": train_step_s, "ground_truth_s": time.perf_counter() - start}
