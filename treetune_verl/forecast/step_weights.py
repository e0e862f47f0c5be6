# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The model's own parameters moved to θ, θ′ = θ + Δθ and θ − Δθ around one optimizer step, with one copy of them.

Works on this rank's shards (``sharding.local_tensor``); under FSDP2 the gathered copies are dropped before every
write (``sharding.reshard``), so the next forward sees the new values. Sequence of one forecast::

    weights = WeightsAroundStep(components)   # copy of θ
    verl's optimizer step                     # parameters: θ′
    weights.swap()                            # parameters: θ, the copy: θ′; returns ‖Δθ‖² of this rank's shards
    weights.minus_step()                      # parameters: θ − Δθ = 2θ − θ′ (one rounding)
    weights.displace(d, ε)                    # (entropy control) parameters: θ′ + ε d
    weights.restore()                         # parameters: θ′, bit for bit as the step left them

One copy of the shards (float32 for a float32 model) is held from construction to ``restore``; ``swap`` needs one
temporary the size of the largest parameter shard.
"""

from __future__ import annotations

import torch

from treetune_verl.forecast.sharding import local_tensor, reshard
from treetune_verl.probe.components import ProbeComponents


class WeightsAroundStep:
    """See the module docstring. ``restore`` is safe to call in any state (a ``finally`` after an error included)."""

    def __init__(self, components: ProbeComponents) -> None:
        self.model = components.model
        self.params = components.named_params
        with torch.no_grad():
            self.saved = {name: local_tensor(p).detach().clone() for name, p in self.params}  # θ
        self.swapped: set[str] = set()  # parameters whose copy holds θ′ (the parameter itself θ or θ − Δθ)

    def _shards(self) -> list[tuple[str, torch.Tensor]]:
        # Fetched at every use: FSDP2 re-points a parameter's local tensor (seen for the root module's parameters of
        # SmolLM2 between a step and the next forward); a tensor kept from before would be stale memory.
        return [(name, local_tensor(p)) for name, p in self.params]

    @torch.no_grad()
    def swap(self) -> float:
        """Parameters θ′ -> θ, the copy θ -> θ′; returns Σ ‖θ′ − θ‖² over this rank's shards (fp64 sum)."""
        reshard(self.model)
        shards = self._shards()
        # one scratch buffer per dtype and device for all parameters: a fresh tensor per parameter also costs the
        # allocator's page faults
        sizes: dict[tuple[torch.dtype, torch.device], int] = {}
        for _, shard in shards:
            key = (shard.dtype, shard.device)
            sizes[key] = max(sizes.get(key, 0), shard.numel())
        scratch = {key: torch.empty(size, dtype=key[0], device=key[1]) for key, size in sizes.items()}
        squared = 0.0
        for name, shard in shards:
            stepped = scratch[shard.dtype, shard.device][: shard.numel()].view_as(shard)
            saved = self.saved[name]
            stepped.copy_(shard)  # θ′
            shard.copy_(saved)
            saved.copy_(stepped)
            self.swapped.add(name)
            squared += float(torch.linalg.vector_norm(torch.sub(saved, shard, out=stepped)).double() ** 2)  # exact
        return squared

    def step(self, name: str, shard: torch.Tensor) -> torch.Tensor:
        """Δθ = θ′ − θ of one parameter's shard while the parameters are at θ (after ``swap``): exact in fp32."""
        return self.saved[name] - shard.detach()

    @torch.no_grad()
    def minus_step(self) -> None:
        """Parameters θ -> θ − Δθ = 2θ − θ′ (after ``swap``)."""
        if len(self.swapped) != len(self.params):
            raise RuntimeError("WeightsAroundStep.minus_step before swap()")
        reshard(self.model)
        for name, shard in self._shards():
            shard.lerp_(self.saved[name], -1.0)  # θ + (−1)(θ′ − θ), in one pass

    @torch.no_grad()
    def displace(self, direction: dict[str, torch.Tensor], scale: float) -> None:
        """Parameters -> the copy + ``scale`` · d: θ′ + ``scale`` · d when the copy holds θ′ (after ``swap``, or a
        ``WeightsAroundStep`` made at θ′, as the entropy controller makes one: ``control/sensitivity.py``).
        ``direction``: d per parameter name, like its local shard (any float dtype; a name without one is set to the
        copy). ``restore`` brings back the copy exactly."""
        if not self.saved:
            raise RuntimeError("WeightsAroundStep.displace after restore()")
        reshard(self.model)
        for name, shard in self._shards():
            shard.copy_(self.saved[name])
            if name in direction:
                shard.add_(direction[name].to(shard.dtype), alpha=scale)
            self.swapped.add(name)

    def keep(self) -> None:
        """Leave the parameters as they are (the last ``displace``: the entropy controller's step) and free the copy;
        a later ``restore`` does nothing."""
        self.swapped.clear()
        self.saved.clear()

    @torch.no_grad()
    def restore(self) -> None:
        """Parameters -> θ′ as the optimizer step left them; frees the copy."""
        reshard(self.model)
        for name, shard in self._shards():
            if name in self.swapped:
                shard.copy_(self.saved[name])
        self.swapped.clear()
        self.saved.clear()
