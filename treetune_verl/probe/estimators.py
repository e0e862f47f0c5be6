# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Surrogate losses whose ``backward()`` leaves X (entropy-gradient estimate) or Y (policy-gradient) in ``.grad``.

Shape notation:
    b = prompts in the microbatch, G = responses per prompt, R = response columns
    S[b, g] = Σ_j log π(y_j | s_j)  (sequence log-probability under the sampling policy, nats)
    H[b, g, j] = entropy of π(·|s_j) in nats;  L[b, g] = response length;  L_max[b] = per-prompt normaliser

Every loss returns the SUM over the b prompts of a per-prompt quantity, so that summing microbatches gives the same
total as one pass over the whole batch; means over prompts are taken by the caller. Per-prompt targets:

    X_b estimates  ∇ H_seq(x_b) / L_max(x_b),   H_seq(x) = E_y[-log π(y|x)] = E_y[Σ_k H_k(s_k)]
    Y_b         =  ∇ mean_g (A_bg / L_max(x_b)) · S_bg         (Dr.GRPO objective; ascent direction)

Naive X (score function with a leave-one-out baseline), since ∇H_seq = -E[S ∇S] and E[∇S] = 0:

    X_b = -mean_g (S_w,g - S_w,LOO,g) ∇S_g,   S_w = S / L_max (dr_grpo) or S / L (per_token_avg),
    S_w,LOO,g = mean of S_w over the other G - 1 responses (independent of sample g, hence unbiased).

With ``per_token_avg`` and variable lengths, E[X_b] = -E[(S/L) ∇S], which is not the gradient of H_seq / L_max;
it matches ``dr_grpo`` exactly only when every response has the same length.

Rao-Blackwellised X (``rb_residual``). Differentiating E[Σ_k H_k(s_k)], where H_k depends on θ directly and through
the distribution of the prefix s_k:

    ∇ E[Σ_k H_k] = E[Σ_k ∇H_k] + E[Σ_j ∇log π(y_j|s_j) · Σ_{k>j} H_k]

(token j's score multiplies only later terms, since H_k for k <= j is fixed given s_j). Any b_j that is a function of
s_j alone can be subtracted from Σ_{k>=j} H_k =: G_j, because E[∇log π(y_j|s_j) | s_j] = 0. With b_j = H_j + μ_j:

    X_b = mean_g [ Σ_j (G_j - b_j) ∇log π(y_j|s_j) + Σ_k ∇H_k ]   (divided by L_max when normalising)

μ_j (``residual_mu``) is a per-position running mean of the residual G_j - H_j = Σ_{k>j} H_k from PREVIOUS batches
(see ``ResidualBaseline``); ``none`` uses μ = 0; ``loo`` uses μ_{g,j} = the mean residual at j over the prompt's
other responses (``leave_one_out``: independent of response g, and it follows the prompt). Dividing by the per-prompt L_max keeps it unbiased; dividing each
sequence by its own random length (as one might be tempted to) would not: the length is random and correlated with the
score function.
"""

from __future__ import annotations

import torch

from treetune_verl.probe.batch import check_group_size
from treetune_verl.probe.teacher_forcing import TeacherForced


def sequence_stats(tf: TeacherForced) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S, L)``: sequence log-probabilities ``[b, G]`` fp32 (differentiable) and lengths ``[b, G]`` fp32."""
    return tf.token_logprobs.sum(dim=-1), tf.response_mask.sum(dim=-1).float()


def naive_x_loss(tf: TeacherForced, max_lengths: torch.Tensor, weighting_mode: str) -> torch.Tensor:
    """Σ_b -mean_g detach(S_w - S_w,LOO) · S; its gradient is Σ_b X_b (naive). Needs G >= 2.

    Args:
        tf: teacher-forced results of the microbatch.
        max_lengths: ``[b]`` per-prompt L_max (any numeric dtype, any device).
        weighting_mode: ``dr_grpo`` (S / L_max) or ``per_token_avg`` (S / L).
    """
    S, L = sequence_stats(tf)
    b, G = S.shape
    check_group_size(G, "estimator.x_estimator_mode=naive", "a leave-one-out baseline")
    lmax = max_lengths.to(S.device, torch.float32).view(b, 1)
    with torch.no_grad():
        if weighting_mode == "dr_grpo":
            S_w = S / lmax
        elif weighting_mode == "per_token_avg":
            S_w = S / L
        else:
            raise ValueError(f"probe.weighting_mode must be 'dr_grpo' or 'per_token_avg', got {weighting_mode!r}")
        loo = (S_w.sum(dim=1, keepdim=True) - S_w) / (G - 1)
        coef = S_w - loo  # [b, G]
    return -(coef * S).mean(dim=1).sum()


def rb_residual_x_loss(
    tf: TeacherForced,
    max_lengths: torch.Tensor,
    mu: torch.Tensor | None,
    normalize_by_length: bool,
    leave_one_out: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Σ_b mean_g [Σ_j detach(G_j - H_j - μ_j) log π(y_j|s_j) + Σ_k H_k] (/ L_max); gradient Σ_b X_b (RB).

    Args:
        tf: teacher-forced results with entropies.
        max_lengths: ``[b]`` per-prompt L_max.
        mu: ``[R]`` baseline residual means (nats, un-normalised) from previous batches, or None for μ = 0.
        normalize_by_length: divide each prompt's term by L_max.
        leave_one_out: μ_{g,j} = the mean residual at position j over the OTHER responses of the same prompt that
            reach it (0 if none; ``mu`` must then be None). Independent of response g, so unbiased like ``mu``, and
            it follows the prompt: the residual's level depends on the prompt (e.g. the answer's length). Needs G >= 2.

    Returns:
        ``(loss, residual_sum, residual_count)``: the scalar loss, and the per-position sum ``[R]`` fp64 and count
        ``[R]`` fp64 of the detached residuals G_j - H_j over valid positions (for updating μ afterwards).
    """
    if tf.entropies is None:
        raise ValueError("rb_residual needs teacher-forced entropies (with_entropy=True)")
    H = tf.entropies  # [b, G, R], 0 at padding
    valid = tf.response_mask
    b, G, R = H.shape
    with torch.no_grad():
        returns = H.flip(-1).cumsum(-1).flip(-1)  # G_j = Σ_{k>=j} H_k; padding adds 0
        residual = (returns - H).masked_fill(~valid, 0.0)  # Σ_{k>j} H_k
        if leave_one_out:
            if mu is not None:
                raise ValueError("rb_residual_x_loss: give either mu or leave_one_out, not both")
            check_group_size(G, "estimator.baseline.mode=loo", "a leave-one-out baseline")
            others = valid.sum(dim=1, keepdim=True) - valid.to(torch.long)  # [b, G, R] responses besides g at j
            loo = (residual.sum(dim=1, keepdim=True) - residual) / others.clamp(min=1)
            coef = residual - loo.masked_fill(others == 0, 0.0)
        else:
            coef = residual if mu is None else residual - mu.to(H.device, H.dtype).view(1, 1, R)
        coef = coef.masked_fill(~valid, 0.0)
        residual_sum = residual.double().sum(dim=(0, 1)).cpu()
        residual_count = valid.double().sum(dim=(0, 1)).cpu()
    per_seq = (coef * tf.token_logprobs).sum(dim=-1) + H.sum(dim=-1)  # [b, G]
    per_prompt = per_seq.mean(dim=1)
    if normalize_by_length:
        per_prompt = per_prompt / max_lengths.to(H.device, torch.float32)
    return per_prompt.sum(), residual_sum, residual_count


def y_loss(tf: TeacherForced, advantages: torch.Tensor, max_lengths: torch.Tensor) -> torch.Tensor:
    """Σ_b mean_g (A_bg / L_max(b)) · S_bg: the Dr.GRPO objective summed over prompts; gradient Σ_b Y_b."""
    S, _ = sequence_stats(tf)
    b = S.shape[0]
    weights = advantages.to(S.device, torch.float32) / max_lengths.to(S.device, torch.float32).view(b, 1)
    return (weights * S).mean(dim=1).sum()


class ResidualBaseline:
    """Per-position running mean μ_j of the residual G_j - H_j = Σ_{k>j} H_k (nats, not length-normalised).

    Convention: μ_j ← decay · μ_j + (1 - decay) · m_j, with m_j the batch mean of the residual at response position j
    (0-based) and ``decay = estimator.baseline.ema_decay`` the weight of the OLD value. A position seen for the first
    time is initialised to m_j (no shrinkage towards 0); a position never seen has μ_j = 0, so the very first batch
    runs with b_j = H_j (the same as ``none``).

    The probe reads μ before a batch and updates it once after the whole batch (all microbatches), from detached
    values: the baseline applied to a sample never depends on that sample, and the buffers do not depend on the
    microbatch size. State is kept in fp64 on CPU.
    """

    def __init__(self, ema_decay: float) -> None:
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"estimator.baseline.ema_decay must be in [0, 1), got {ema_decay}")
        self.decay = float(ema_decay)
        self.mu = torch.zeros(0, dtype=torch.float64)
        self.seen = torch.zeros(0, dtype=torch.bool)
        self.updates = 0

    def _grow(self, n: int) -> None:
        if self.mu.numel() < n:
            extra = n - self.mu.numel()
            self.mu = torch.cat([self.mu, torch.zeros(extra, dtype=torch.float64)])
            self.seen = torch.cat([self.seen, torch.zeros(extra, dtype=torch.bool)])

    def vector(self, length: int) -> torch.Tensor:
        """μ for positions ``0 .. length-1`` as ``[length]`` fp32 (0 where never seen); a copy."""
        self._grow(length)
        return self.mu[:length].float().clone()

    def update(self, residual_sum: torch.Tensor, residual_count: torch.Tensor) -> None:
        """Fold one batch's per-position residual sums/counts (``[R]`` each) into μ."""
        R = residual_sum.numel()
        self._grow(R)
        present = residual_count > 0
        batch_mean = torch.where(present, residual_sum / residual_count.clamp(min=1), 0.0).double()
        old = self.mu[:R]
        blended = torch.where(self.seen[:R], self.decay * old + (1.0 - self.decay) * batch_mean, batch_mean)
        self.mu[:R] = torch.where(present, blended, old)
        self.seen[:R] |= present
        self.updates += 1

    def state_dict(self) -> dict[str, object]:
        return {"mu": self.mu.clone(), "seen": self.seen.clone(), "updates": self.updates, "decay": self.decay}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.mu = state["mu"].clone()  # type: ignore[union-attr]
        self.seen = state["seen"].clone()  # type: ignore[union-attr]
        self.updates = int(state["updates"])  # type: ignore[arg-type]
        self.decay = float(state["decay"])  # type: ignore[arg-type]
