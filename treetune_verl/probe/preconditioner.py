# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The Adam preconditioner P read from an existing Adam/AdamW state.

    P(g) = g / (sqrt(v̂) + eps),   v̂ = exp_avg_sq / (1 - β2^step)        (per parameter, elementwise)

so that an Adam step with β1 = 0 on the loss -J moves the parameters by Δθ = lr · P(∇J). Identity for parameters
without state (never stepped) and for any other optimizer; the count of such parameters is reported.

What ΔH₁ = lr·⟨X̄, P Ȳ⟩ leaves out, by construction:
- The real step first folds the new gradient into v; P uses the state before that. Exactly,
  v̂' = v̂ + c·(g² - v̂) with c = (1 - β2) / (1 - β2^(step+1)): O(1 - β2) once the bias correction has saturated,
  but about 1 / (step + 1) for a young state (after one warm-up step the real step uses the mean of two g²).
- Momentum: with β1 > 0 the real step is lr · m̂ / (sqrt(v̂) + eps) with m̂ mixing earlier gradients; the part due to
  this batch is (1 - β1) / (1 - β1^step) of P(g). P models β1 = 0.
- AdamW's decoupled weight decay (θ ← θ - lr·wd·θ) is not in ΔH₁; ``deltaH_true`` includes it.
- ``amsgrad`` uses ``max_exp_avg_sq`` in place of ``exp_avg_sq``, as torch does.
"""

from __future__ import annotations

import torch


class AdamPreconditioner:
    """Elementwise P(g) from ``optimizer.state``; ``apply`` runs on the parameter's device, in the state's dtype."""

    def __init__(self, optimizer: torch.optim.Optimizer | None, params: list[torch.nn.Parameter]) -> None:
        # id(param) -> (second-moment tensor, sqrt(1 - β2^step), eps); read lazily so no param-sized copy is kept.
        self._state: dict[int, tuple[torch.Tensor, float, float]] = {}
        self.kind = "identity"
        if optimizer is not None and isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            self.kind = "adam"
            for group in optimizer.param_groups:
                _, beta2 = group["betas"]
                eps = group["eps"]
                for p in group["params"]:
                    state = optimizer.state.get(p, {})
                    if "exp_avg_sq" not in state:
                        continue
                    step = float(state["step"])
                    v = state["max_exp_avg_sq"] if group.get("amsgrad", False) else state["exp_avg_sq"]
                    self._state[id(p)] = (v, (1.0 - beta2**step) ** 0.5, float(eps))
        self.num_params = len(params)
        self.num_without_state = sum(1 for p in params if id(p) not in self._state)

    def apply(self, grad: torch.Tensor, param: torch.nn.Parameter) -> torch.Tensor:
        """``P(grad)`` for one parameter (a new tensor; identity if the parameter has no state)."""
        state = self._state.get(id(param))
        if state is None:
            return grad
        v, bias_correction2_sqrt, eps = state
        # Same formula and order as torch's single-tensor Adam: sqrt(v) / sqrt(1 - β2^step) + eps.
        denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
        return grad / denom.to(grad.dtype)

    def describe(self) -> dict[str, object]:
        return {"preconditioner": self.kind, "params_without_state": self.num_without_state, "params": self.num_params}
