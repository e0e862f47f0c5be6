# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""What crosses from the inference server to the agent loops: per-token entropy next to the sampled tokens.

Kept free of sglang imports on purpose: ``EntropyTokenOutput`` is unpickled in every agent-loop worker process
(Ray pickles classes by module), and importing sglang there would cost tens of seconds per process for nothing.
``treetune_verl.sglang.server`` re-exports it.

Data flow (one sample):
    EntropySGLangHttpServer.generate  -> EntropyTokenOutput(token_ids, log_probs, entropy)  one value per token
    Entropy*AgentLoop (EntropyRecorder) -> AgentLoopOutput.extra_fields["response_entropy"]   len(response_ids)
    EntropyAgentLoopWorker            -> DataProto.batch["rollout_entropy"]               [batch, response_length]
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from verl.workers.rollout.replica import TokenOutput

from treetune_verl.sglang.entropy import EntropyConfig

RESPONSE_ENTROPY_KEY = "response_entropy"  # AgentLoopOutput.extra_fields, loop -> worker (popped by the worker)
ROLLOUT_ENTROPY_KEY = "rollout_entropy"  # DataProto.batch, float32 [batch, response_length], nats
ENTROPY_SECTION = "entropy"  # actor_rollout_ref.rollout.custom.entropy.{top_k,mode}
CONFIG_PATH = "actor_rollout_ref.rollout"


class EntropyTokenOutput(TokenOutput):
    """verl's ``TokenOutput`` plus the entropy (nats) of the distribution each token was sampled from.

    ``entropy[i]`` belongs to ``token_ids[i]``; ``None`` when the request did not ask for logprobs (sglang computes
    entropy only for requests with ``return_logprob=True``).
    """

    entropy: list[float] | None = None


def served_entropy(output: Any) -> list[float]:
    """The per-token entropy carried by a server's output; raises if absent or misaligned with ``token_ids``."""
    entropy = getattr(output, "entropy", None)
    if entropy is None:
        raise RuntimeError(
            f"the inference server returned no per-token entropy ({type(output).__name__}): rollout entropy needs "
            f"treetune_verl's EntropySGLangHttpServer (select {CONFIG_PATH}.agent.agent_loop_manager_class="
            f"treetune_verl.agent_loop.EntropyAgentLoopManager) and {CONFIG_PATH}.calculate_log_probs=True"
        )
    if len(entropy) != len(output.token_ids):
        raise RuntimeError(f"server returned {len(entropy)} entropies for {len(output.token_ids)} tokens")
    return [float(value) for value in entropy]


def attach_response_entropy(output: Any, entropy: list[float], response_length: int) -> None:
    """Truncate ``entropy`` to ``response_length`` as verl truncates ``response_ids`` and put it into
    ``output.extra_fields["response_entropy"]``; raises if it does not align with ``output.response_ids``."""
    entropy = entropy[:response_length]
    if len(entropy) != len(output.response_ids):
        raise RuntimeError(f"entropy/response misaligned: {len(entropy)} != {len(output.response_ids)}")
    output.extra_fields[RESPONSE_ENTROPY_KEY] = entropy


class EntropyRecorder:
    """Stands in for an agent loop's ``server_manager``: forwards ``generate`` and keeps the entropy it served.

    verl creates one agent-loop object per sample and each loop awaits one ``generate`` at a time, so a single
    pending slot is enough: the loop reads it with :meth:`take` right after the parent's handler returns.
    Everything else is forwarded to the wrapped manager.
    """

    def __init__(self, server_manager: Any) -> None:
        self._server_manager = server_manager
        self._pending: list[float] | None = None

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        output = await self._server_manager.generate(*args, **kwargs)
        self._pending = served_entropy(output)
        return output

    def take(self) -> list[float]:
        """Entropy of the last ``generate`` (one value per returned token); raises if none happened since."""
        if self._pending is None:
            raise RuntimeError("EntropyRecorder.take(): no generate() call since the last take()")
        entropy, self._pending = self._pending, None
        return entropy

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not yet initialised (copy/pickle) or private: do not recurse
            raise AttributeError(name)
        return getattr(self._server_manager, name)


def _get(config: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a DictConfig, a dict or a dataclass (verl hands out all three)."""
    if config is None:
        return default
    if isinstance(config, Mapping) or callable(getattr(config, "get", None)):
        return config.get(key, default)
    return getattr(config, key, default)


def entropy_config(rollout_config: Any) -> EntropyConfig:
    """``EntropyConfig`` from ``actor_rollout_ref.rollout.custom.entropy`` (absent keys take the defaults).

    ``custom`` is verl's extension point in ``RolloutConfig``; top-level rollout keys would be rejected by verl's
    dataclass conversion.
    """
    section = _get(_get(rollout_config, "custom"), ENTROPY_SECTION) or {}
    top_k = _get(section, "top_k", 0)
    mode = _get(section, "mode", "raw")
    try:
        return EntropyConfig(top_k=top_k, mode=mode)
    except ValueError as exc:
        raise ValueError(f"{CONFIG_PATH}.custom.{ENTROPY_SECTION}: {exc}") from None


def planned_server_args(rollout_config: Any) -> SimpleNamespace:
    """The sglang server arguments that decide entropy support, as verl 0.7.1's ``launch_server`` will set them.

    verl builds ``ServerArgs`` inside ``SGLangHttpServer.launch_server`` (``async_sglang_server.py:187-246``):
    ``dp_size`` from ``data_parallel_size``, the speculative algorithm from ``mtp``, then
    ``engine_kwargs.sglang`` spread last (so it overrides both).
    """
    mtp = _get(rollout_config, "mtp")
    speculative = None
    if _get(mtp, "enable", False) and _get(mtp, "enable_rollout", False):
        speculative = _get(mtp, "speculative_algorithm")
    args: dict[str, Any] = {
        "dp_size": _get(rollout_config, "data_parallel_size", 1),
        "speculative_algorithm": speculative,
    }
    engine_kwargs = _get(_get(rollout_config, "engine_kwargs"), "sglang") or {}
    args.update(dict(engine_kwargs))
    return SimpleNamespace(**args)


def check_rollout_config(rollout_config: Any) -> EntropyConfig:
    """Refuse rollout settings under which entropy would be missing or misaligned; returns the entropy settings.

    Raises:
        ValueError: ``calculate_log_probs`` is off (sglang returns entropy only with logprobs), or the entropy
            section is invalid.
        UnsupportedSGLangError: data-parallel sglang, speculative decoding, pipeline parallelism or disaggregation
            (see ``treetune_verl.sglang.scheduler_patches.check_server_args``).
    """
    from treetune_verl.sglang.scheduler_patches import check_server_args

    if not _get(rollout_config, "calculate_log_probs", False):
        raise ValueError(
            f"rollout entropy needs {CONFIG_PATH}.calculate_log_probs=True: sglang computes and returns per-token "
            "entropy only for requests that ask for logprobs"
        )
    config = entropy_config(rollout_config)
    check_server_args(planned_server_args(rollout_config))
    return config
