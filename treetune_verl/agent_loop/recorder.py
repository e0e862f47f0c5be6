# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""How an agent loop sees the entropy its server served, and hands it on next to ``response_ids``.

``EntropyRecorder`` wraps a loop's ``server_manager`` and keeps the entropy (and, in entropy mode ``support``, each
token's sampled support) of the last ``generate``; ``attach_response_entropy`` / ``attach_response_support`` put a
loop's values into ``AgentLoopOutput.extra_fields`` truncated as verl truncates the response. Shared by every entropy
agent loop (the support: the single-turn loop so far).
"""

from __future__ import annotations

from typing import Any

from treetune_verl.batch_keys import RESPONSE_ENTROPY_KEY, RESPONSE_SUPPORT_KEY
from treetune_verl.rollout.rollout_config import CONFIG_PATH


def served_entropy(output: Any) -> list[float]:
    """The per-token entropy carried by a server's output; raises if absent or misaligned with ``token_ids``."""
    entropy = getattr(output, "entropy", None)
    if entropy is None:
        raise RuntimeError(
            f"the inference server returned no per-token entropy ({type(output).__name__}): rollout entropy needs "
            f"treetune_verl's EntropySGLangHttpServer (select {CONFIG_PATH}.agent.agent_loop_manager_class="
            f"treetune_verl.verl.EntropyAgentLoopManager) and {CONFIG_PATH}.calculate_log_probs=True"
        )
    if len(entropy) != len(output.token_ids):
        raise RuntimeError(f"server returned {len(entropy)} entropies for {len(output.token_ids)} tokens")
    return [float(value) for value in entropy]


def attach_response_entropy(output: Any, entropy: list[float], response_length: int) -> None:
    """Truncate ``entropy`` to ``response_length`` as verl truncates ``response_ids`` and put it into
    ``output.extra_fields["response_entropy"]``; raises if it does not align with ``output.response_ids``."""
    _attach(output, RESPONSE_ENTROPY_KEY, entropy, response_length, "entropy")


def attach_response_support(output: Any, support: list[Any], response_length: int) -> None:
    """Truncate ``support`` to ``response_length`` as verl truncates ``response_ids`` and put it into
    ``output.extra_fields["response_support"]``; raises if it does not align with ``output.response_ids``."""
    _attach(output, RESPONSE_SUPPORT_KEY, support, response_length, "support")


def _attach(output: Any, key: str, values: list[Any], response_length: int, what: str) -> None:
    """``values[:response_length]`` into ``output.extra_fields[key]``, one per element of ``output.response_ids``."""
    values = values[:response_length]
    if len(values) != len(output.response_ids):
        raise RuntimeError(f"{what}/response misaligned: {len(values)} != {len(output.response_ids)}")
    output.extra_fields[key] = values


class EntropyRecorder:
    """Stands in for an agent loop's ``server_manager``: forwards ``generate`` and keeps the entropy it served.

    verl creates one agent-loop object per sample and each loop awaits one ``generate`` at a time, so a single
    pending slot is enough: the loop reads it with :meth:`take` right after the parent's handler returns.
    Everything else is forwarded to the wrapped manager.
    """

    def __init__(self, server_manager: Any, carries_support: bool = False) -> None:
        self._server_manager = server_manager
        # The loop hands each token's support on (take_support); a loop that does not would leave its rows scored
        # over the whole vocabulary against log-probs the server renormalised over the support: refused at once.
        self._carries_support = carries_support
        self._pending: list[float] | None = None
        self._pending_support: list[Any] | None = None  # entropy mode "support" only
        self.last_stop_reason: str | None = None  # of the last generate: "abort" ends a loop (over-sampling)
        self.last_sampling_params: dict[str, Any] | None = None  # of the last generate (a resumed row reuses them)

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        output = await self._server_manager.generate(*args, **kwargs)
        self._pending = served_entropy(output)
        self._pending_support = getattr(output, "support", None)
        if self._pending_support is not None and not self._carries_support:
            raise RuntimeError(
                "entropy mode 'support': this agent loop does not carry each token's sampled support to the actor "
                "(only entropy_single_turn_agent does so far); its rows would be scored over the whole vocabulary "
                f"against log-probs renormalised over the support. Set {CONFIG_PATH}.custom.entropy.mode to 'raw' or "
                "'tempered' for this loop."
            )
        self.last_stop_reason = output.stop_reason
        self.last_sampling_params = dict(kwargs.get("sampling_params") or {})
        return output

    def resume_info(self) -> dict[str, Any]:
        """What a cut row needs to be resumed (``batch_keys.RESUME_KEY``): the last request's stop reason and
        sampling parameters."""
        return {"stop_reason": self.last_stop_reason, "sampling_params": self.last_sampling_params}

    def take(self) -> list[float]:
        """Entropy of the last ``generate`` (one value per returned token); raises if none happened since."""
        if self._pending is None:
            raise RuntimeError("EntropyRecorder.take(): no generate() call since the last take()")
        entropy, self._pending = self._pending, None
        return entropy

    def take_support(self) -> list[Any] | None:
        """The support of the last ``generate``'s tokens (``None``: the server ran another entropy mode)."""
        support, self._pending_support = self._pending_support, None
        return support

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not yet initialised (copy/pickle) or private: do not recurse
            raise AttributeError(name)
        return getattr(self._server_manager, name)
