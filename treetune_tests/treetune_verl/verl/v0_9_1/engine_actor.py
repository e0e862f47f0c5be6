# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1's engine-worker actor on CPU, for the forecast's test and bench: its config, the CPU runtime, and an
``update_actor`` batch laid out as the V1 trainer hands it over.

The layout was read from a real GRPO run's ``update_actor`` batch (``make e2e STACK=current``): unpadded nested rows,
the ``uid`` of each row, the trainer's ``extra_info`` (``trainer_base.py`` ``_update_actor``) as non-tensor fields,
``old_log_probs`` from the worker's own ``compute_log_prob`` as ``_compute_old_log_prob`` computes them.
"""

from __future__ import annotations

import os

import numpy as np
import torch

CPU_RUNTIME = {  # what the e2e script sets for verl 0.9.1 on CPU (test_entropy_e2e.sh); read at interpreter start
    "TREETUNE_VERL_CPU_PATCHES": "1",
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
    "CUDA_VISIBLE_DEVICES": "0",
}


def actor_config(
    model_path: str, prompt: int, response: int, rows: int, n: int, micro_rows: int, lr: float, clip_grad: float
):
    """verl 0.9.1's trainer config for the actor alone: FSDP2 in float32 (no mixed precision), one mini-batch of
    ``rows`` rows per update (``rollout.n = n``), ``micro_rows`` per forward, AdamW (weight decay 0.01)."""
    from treetune_tests.treetune_verl.verl_config import compose_ppo_trainer

    return compose_ppo_trainer(
        model_path,
        prompt,
        response,
        [
            "trainer.device=cpu",
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.dtype=float32",
            "++actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
            "actor_rollout_ref.actor.use_torch_compile=False",
            "actor_rollout_ref.model.use_remove_padding=False",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={rows // n}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_rows}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_rows}",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",  # rank means of equal rows: the global mean
            f"actor_rollout_ref.rollout.n={n}",
            f"actor_rollout_ref.actor.optim.lr={lr}",
            "actor_rollout_ref.actor.optim.weight_decay=0.01",
            f"actor_rollout_ref.actor.optim.clip_grad={clip_grad}",
        ],
    )


def join_process_group(rank: int, world: int, port: int) -> None:
    """The environment verl's worker reads to join its gloo group (``torchrun``'s variables)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)


def v1_rows(
    prompts: list[torch.Tensor],
    responses: list[torch.Tensor],
    advantages: list[torch.Tensor],
    rows_per_mini_batch: int,
    uids: list[str] | None = None,
    extra_fields: list[dict] | None = None,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
):
    """The V1 trainer's ``TensorDict`` of these rows (``prompts[i]``, ``responses[i]``: 1-D token ids; every response
    token a model token; ``rows_per_mini_batch``: of all ranks), ``old_log_probs`` zero; with the rows' ``uid`` and
    ``extra_fields`` (what the agent loop put there, e.g. ``response_support``) where given."""
    from verl.utils import tensordict_utils as tu

    def nested(tensors):
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)

    input_ids = [torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]
    ones = [torch.ones(len(r), dtype=torch.int64) for r in responses]
    fields = {
        "input_ids": nested(input_ids),
        "position_ids": nested([torch.arange(len(ids)) for ids in input_ids]),
        "prompts": nested(prompts),
        "responses": nested(responses),
        "response_mask": nested(ones),
        "loss_mask": nested(ones),
        "old_log_probs": nested([torch.zeros(len(r)) for r in responses]),
        "advantages": nested(advantages),
    }
    if uids is not None:
        fields["uid"] = np.array(uids, dtype=object)
    if extra_fields is not None:
        fields["extra_fields"] = extra_fields
    return tu.get_tensordict(
        fields,
        non_tensor_dict={
            "calculate_entropy": calculate_entropy,
            "distillation_use_topk": False,
            "distillation_only": False,
            "global_batch_size": rows_per_mini_batch,  # the trainer's extra_info (trainer_base.py _update_actor)
            "mini_batch_size": rows_per_mini_batch,
            "epochs": 1,
            "seed": 42,
            "dataloader_kwargs": {"shuffle": False},
            "temperature": temperature,
        },
    )


def update_batch(
    worker,
    prompts: list[torch.Tensor],
    responses: list[torch.Tensor],
    advantages: list[torch.Tensor],
    uids: list[str],
    rows_per_mini_batch: int,
):
    """``update_actor``'s ``TensorDict`` of these rows (:func:`v1_rows`), ``old_log_probs`` from
    ``worker.compute_log_prob``."""
    from verl.workers.utils.padding import response_from_nested

    batch = v1_rows(prompts, responses, advantages, rows_per_mini_batch, uids=uids)
    log_probs = worker.compute_log_prob(batch.copy())["log_probs"]  # every position of each row
    batch["old_log_probs"] = response_from_nested(log_probs, batch["response_mask"])  # as _compute_old_log_prob
    return batch
