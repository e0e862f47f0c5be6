# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Generation through verl's agent-loop manager on Ray, with the entropy server the trainer uses.

``backend=verl`` of the generation job: verl's agent-loop manager in standalone rollout mode (no trainer, no actor;
the installed verl's, ``treetune_verl.verl.adapter("generation_rollout")``: the block's ``EntropyAgentLoopManager`` on
verl 0.7.1, verl's ``AgentLoopManager`` with our entropy worker and servers on verl 0.9.1) starts
``verl.nnodes x verl.n_gpus_per_node / tensor_model_parallel_size`` replicas of ``EntropySGLangHttpServer`` on the
Ray cluster, and ``verl.num_workers`` agent-loop workers spread the rows over them. So the job scales to every
machine of a Ray cluster, through exactly the classes (server, loop, entropy worker,
``DataProto.batch["rollout_entropy"]``) that carry entropy into training.

Rows go to the manager ``verl.batch_size`` at a time; each batch's responses are handed over as one Engine-shaped
output per row (what :func:`treetune_verl.generation.records.record_from_output` reads), so the job writes the same
rows whichever backend served them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, open_dict

from treetune_verl.generation.engine_runner import GenerationRequest
from treetune_verl.verl import adapter

# Ray's placement-group bundle of one rollout replica in verl 0.7.1 (``RayResourcePool``: ``{"CPU": 3, "GPU": 1}``
# per GPU), plus one CPU for verl's master-port task and one per agent-loop worker.
_CPUS_PER_GPU_BUNDLE = 3


def compose_verl_config(cfg: DictConfig, model: str, prompt_length: int) -> DictConfig:
    """The installed verl's ``ppo_trainer`` composed with the README block, the job's sampling / entropy / layout and
    what that verl's standalone rollout needs (its adapter's ``OVERRIDES``).

    ``prompt_length``: the longest chat-templated prompt of the run (verl pads every prompt to it; the server then
    allows ``sampling.max_new_tokens`` new tokens for each).
    """
    import verl
    from hydra import compose, initialize_config_dir

    from treetune_verl.config import read_overrides

    rollout = "actor_rollout_ref.rollout"
    overrides = read_overrides() + [
        f"actor_rollout_ref.model.path={model}",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={cfg.sampling.max_new_tokens}",
        f"{rollout}.temperature={float(cfg.sampling.temperature)}",
        f"{rollout}.top_p={float(cfg.sampling.top_p)}",
        f"{rollout}.top_k={int(cfg.sampling.top_k)}",
        f"{rollout}.n=1",  # the job sends one row per (prompt, sample index)
        f"{rollout}.custom.entropy.top_k={int(cfg.entropy.top_k)}",
        f"{rollout}.custom.entropy.mode={cfg.entropy.mode}",
        f"{rollout}.agent.num_workers={int(cfg.verl.num_workers)}",
        f"{rollout}.nnodes={int(cfg.verl.nnodes)}",
        f"{rollout}.n_gpus_per_node={int(cfg.verl.n_gpus_per_node)}",
        f"{rollout}.tensor_model_parallel_size={int(cfg.verl.tensor_model_parallel_size)}",
        *adapter("generation_rollout").OVERRIDES,
        *cfg.verl.overrides,
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    with open_dict(config):
        config.actor_rollout_ref.rollout.engine_kwargs.sglang = {
            **config.actor_rollout_ref.rollout.engine_kwargs.get("sglang", {}),
            **server_engine_kwargs(cfg, model),
        }
    return config


def server_engine_kwargs(cfg: DictConfig, model: str) -> dict[str, Any]:
    """sglang Engine arguments of every server: the job's seed and batch; on a machine without CUDA the project's
    CPU settings, and no memory saver (``torch_memory_saver`` is CUDA-only)."""
    from treetune_verl.sglang.engine import engine_kwargs

    kwargs = engine_kwargs(
        model,
        cfg.model.device,
        random_seed=int(cfg.sampling.seed),
        max_running_requests=int(cfg.engine.max_running_requests),
    )
    kwargs.pop("model_path")
    if kwargs.get("device") == "cpu":
        kwargs["enable_memory_saver"] = False
    return kwargs


@contextlib.contextmanager
def ray_cluster(cfg: DictConfig) -> Iterator[None]:
    """Ray for the run: an already initialised one as is; else ``verl.ray_address`` (``auto``, ``host:port``), or a
    local cluster of our own, shut down on exit. Without CUDA the local cluster declares the GPUs verl's resource
    pool counts (declared, not real: the servers run the CPU settings)."""
    import ray

    if ray.is_initialized():
        yield
        return
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}}
    if cfg.verl.ray_address is not None:
        kwargs["address"] = cfg.verl.ray_address
    else:
        gpus = int(cfg.verl.nnodes) * int(cfg.verl.n_gpus_per_node)
        kwargs.update(
            address="local",  # a cluster of our own, never someone else's
            num_cpus=_CPUS_PER_GPU_BUNDLE * gpus + 1 + int(cfg.verl.num_workers),  # logical CPUs (scheduling only)
            include_dashboard=False,
        )
        if not torch.cuda.is_available():
            kwargs["num_gpus"] = gpus
    ray.init(**kwargs)
    try:
        yield
    finally:
        ray.shutdown()


def rollout_batch(requests: Sequence[GenerationRequest], start_index: int = 0) -> Any:
    """The rollout input verl's trainer hands the agent loops: one chat prompt per row (the default loop,
    ``entropy_single_turn_agent``, applies the chat template, as the Engine backend does)."""
    from verl.protocol import DataProto

    raw_prompt = np.empty(len(requests), dtype=object)
    raw_prompt[:] = [list(request.item.messages) for request in requests]
    index = np.arange(start_index, start_index + len(requests))
    return DataProto.from_dict(non_tensors={"raw_prompt": raw_prompt, "index": index}, meta_info={"global_steps": 0})


def engine_shaped_outputs(batch: Any, max_new_tokens: int, eos_token_ids: set[int], tokenizer: Any) -> list[dict]:
    """Each row of a rollout ``DataProto`` as the sglang Engine's output of that response: ``text`` and
    ``meta_info`` with ``output_token_logprobs`` ``[(logprob, token_id, None)]``, ``output_token_entropy`` (nats)
    and ``finish_reason`` (``length`` when the response filled ``max_new_tokens`` without ending in an EOS id, else
    ``stop``: the rollout carries no finish reason).

    Raises ``RuntimeError`` for a row without entropy (``has_rollout_entropy`` False: its zeros are not measured)."""
    from treetune_verl.batch_keys import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
    from treetune_verl.sglang.tokenizer_patches import META_INFO_ENTROPY_KEY

    prompt_length = batch.batch["prompts"].shape[1]
    outputs = []
    for i in range(len(batch)):
        if not bool(batch.batch[HAS_ROLLOUT_ENTROPY_KEY][i]):
            raise RuntimeError(f"rollout row {i} carries no entropy (has_rollout_entropy=False)")
        n = int(batch.batch["attention_mask"][i, prompt_length:].sum())
        token_ids = batch.batch["responses"][i, :n].tolist()
        logprobs = batch.batch["rollout_log_probs"][i, :n].tolist()
        entropy = batch.batch[ROLLOUT_ENTROPY_KEY][i, :n].tolist()
        filled = n >= max_new_tokens and not (token_ids and token_ids[-1] in eos_token_ids)
        outputs.append(
            {
                "text": tokenizer.decode(token_ids, skip_special_tokens=True),
                "meta_info": {
                    "output_token_logprobs": [(lp, t, None) for lp, t in zip(logprobs, token_ids, strict=True)],
                    META_INFO_ENTROPY_KEY: entropy,
                    "finish_reason": {"type": "length" if filled else "stop"},
                },
            }
        )
    return outputs


def eos_token_ids(model: str, tokenizer: Any) -> set[int]:
    """Every id that ends a response: the generation config's (an int or a list) and the tokenizer's."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id} - {None}
    with contextlib.suppress(OSError):  # a model folder without generation_config.json
        configured = GenerationConfig.from_pretrained(model).eos_token_id
        ids |= set(configured if isinstance(configured, list) else [configured]) - {None}
    return ids


def stream_generate_verl(
    cfg: DictConfig,
    model: str,
    tokenizer: Any,
    requests: Sequence[GenerationRequest],
    on_output: Callable[[GenerationRequest, dict[str, Any]], None],
) -> None:
    """Generate every request through verl's agent-loop manager on Ray; ``on_output(request, output)`` runs for
    each row (Engine-shaped, see :func:`engine_shaped_outputs`) as its batch of ``verl.batch_size`` completes.
    Starts and stops the servers (and a local Ray cluster unless one is running or ``verl.ray_address`` is set)."""
    prompt_length = max(len(request.input_ids) for request in requests)
    config = compose_verl_config(cfg, model, prompt_length)
    stop_ids = eos_token_ids(model, tokenizer)
    size = int(cfg.verl.batch_size)
    with ray_cluster(cfg):
        manager = adapter("generation_rollout").start(config)
        for start in range(0, len(requests), size):
            chunk = requests[start : start + size]
            batch = manager.generate_sequences(rollout_batch(chunk, start))
            outputs = engine_shaped_outputs(batch, int(cfg.sampling.max_new_tokens), stop_ids, tokenizer)
            for request, output in zip(chunk, outputs, strict=True):
                on_output(request, output)
