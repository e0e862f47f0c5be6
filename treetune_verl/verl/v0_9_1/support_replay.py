# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.9.1's actor over the sampled support (issue 48, entropy mode ``support``): each response token's logits
masked outside the support sglang sampled it from, before verl's temperature, log-softmax and entropy.

Seam: ``FSDPEngineWithLMHead.prepare_model_outputs`` (``workers/engine/fsdp/transformer_impl.py``), the one function
the old-log-prob pass, the update and the reference model's log-probs all go through, with the model's output and
the micro-batch's rows (every TransferQueue field, ``extra_fields`` included). Wrapped: before verl's own, the
logits of every response token whose row carries ``extra_fields["response_support"]`` with ids are masked
(``ppo/support_replay.py``); rows without it (a stock loop, an untruncated request, verl's padding rows) are left as
they are. The reference model's log-probs are renormalised the same way: a KL term then compares the two policies
on the support the token was drawn from.

Where response token ``j`` of row ``i`` is predicted: at input position ``P_i + j - 1`` (``P_i`` its prompt's
length), in the padded logits ``[B, S, V]`` (rows left-aligned, as ``prepare_model_inputs`` pads them) or at packed
index ``offsets[i] + P_i + j - 1`` of ``[1, nnz, V]`` (``use_remove_padding``). Refused: fused kernels (no logits)
and logits that are not the micro-batch's whole packed sequence (sequence parallelism).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from treetune_verl.batch_keys import RESPONSE_SUPPORT_KEY
from treetune_verl.patching import Wrap
from treetune_verl.ppo.support_replay import mask_outside_support
from treetune_verl.sglang.support import TOKEN_SUPPORT_FIELDS
from treetune_verl.verl_guard import VERL_CURRENT

__all__ = ["install", "replay_positions"]

# Signature the wrapper repeats: verl 0.9.1 workers/engine/fsdp/transformer_impl.py FSDPEngineWithLMHead.
PREPARE_MODEL_OUTPUTS_PARAMS = ("self", "output", "output_args", "micro_batch", "logits_processor_func")
_IDS = TOKEN_SUPPORT_FIELDS.index("token_ids")


def _lengths(rows: Any) -> list[int]:
    """Per-row lengths of a TransferQueue field (jagged nested, or dense when every row has one length)."""
    if getattr(rows, "is_nested", False):
        return rows.offsets().diff().tolist()
    return [rows.shape[1]] * rows.shape[0]


def _extra_fields(micro_batch: Any) -> list[dict | None]:
    """The rows' ``extra_fields`` (a ``NonTensorStack``; a micro-batch's item reads as a list of them)."""
    values = micro_batch["extra_fields"]
    return values.tolist() if hasattr(values, "tolist") else list(values)


def replay_positions(
    micro_batch: Any, row_stride: int | None, extra_fields: list[dict | None] | None = None
) -> tuple[torch.Tensor, list[list[int]], list[int]]:
    """The logits rows to mask, each one's support and the micro-batch row it belongs to, for the rows that carry
    supports.

    Args:
        micro_batch: verl's micro-batch ``TensorDict`` (``prompts``, ``responses``, ``response_mask``, ``extra_fields``).
        row_stride: the padded logits' sequence length ``S`` (``[B, S, V]`` viewed as ``[B * S, V]``); ``None`` for
            the packed layout (row ``i`` starts at ``input_ids.offsets()[i]``).
        extra_fields: the rows' ``extra_fields`` when the caller has read them already (else read here).

    Raises:
        ValueError: a real row whose supports do not count one per response token, or a response token outside its
            own support (the rollout and the batch disagree: masking would give it probability 0).
    """
    empty = torch.zeros(0, dtype=torch.int64), [], []
    if micro_batch.get("extra_fields", None) is None:
        return empty
    if extra_fields is None:
        extra_fields = _extra_fields(micro_batch)
    if not any((fields or {}).get(RESPONSE_SUPPORT_KEY) is not None for fields in extra_fields):
        return empty  # another entropy mode: nothing else is read
    prompt_lengths = _lengths(micro_batch["prompts"])
    responses = list(micro_batch["responses"].unbind(0))
    masks = list(micro_batch["response_mask"].unbind(0))
    starts = micro_batch["input_ids"].offsets().tolist() if row_stride is None else None
    positions, supports, rows = [], [], []
    for i, fields in enumerate(extra_fields):
        row = (fields or {}).get(RESPONSE_SUPPORT_KEY)
        if row is None:
            continue
        response, mask = responses[i].tolist(), masks[i]
        if len(row) != len(response):
            if int(mask.sum()) == 0:
                continue  # verl's padding row: a copy of another row's extra_fields beside a one-token response
            raise ValueError(f"row {i}: {len(row)} supports for {len(response)} response tokens")
        first = (i * row_stride if starts is None else starts[i]) + prompt_lengths[i] - 1
        for j, (token, support) in enumerate(zip(response, row, strict=True)):
            ids = support[_IDS]
            if ids is None or not int(mask[j]):
                continue  # drawn from the whole tempered distribution, or not a model token
            if token not in ids:
                raise ValueError(f"row {i}, response token {j} (id {token}) lies outside its sampled support")
            positions.append(first + j)
            supports.append(list(ids))
            rows.append(i)
    return torch.tensor(positions, dtype=torch.int64), supports, rows


def apply_support_replay(output: Any, micro_batch: Any) -> None:
    """Mask ``output.logits`` in place for the micro-batch's rows that carry supports (module docstring); nothing is
    checked or read further for a micro-batch without any (another entropy mode)."""
    from verl.utils import tensordict_utils as tu

    if micro_batch.get("extra_fields", None) is None:
        return
    extra_fields = _extra_fields(micro_batch)
    if not any((fields or {}).get(RESPONSE_SUPPORT_KEY) is not None for fields in extra_fields):
        return
    logits = getattr(output, "logits", None)
    if logits is None:  # fused kernels: log-probs only
        raise ValueError(
            "support replay needs the model's logits: actor_rollout_ref.model.use_fused_kernels=True returns "
            "log-probs only; turn it off with rollout.custom.entropy.mode=support"
        )
    if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        nnz = int(micro_batch["input_ids"].offsets()[-1])
        if logits.shape[:2] != (1, nnz):
            raise ValueError(
                f"support replay: packed logits {tuple(logits.shape)} are not the micro-batch's {nnz} tokens "
                "(sequence parallelism?); not supported with rollout.custom.entropy.mode=support"
            )
        positions, supports, rows = replay_positions(micro_batch, None, extra_fields)
    else:
        positions, supports, rows = replay_positions(micro_batch, logits.shape[1], extra_fields)
    if supports:
        temperature = micro_batch["temperature"]  # what verl divides these logits by: one, or one per row ([B])
        if isinstance(temperature, torch.Tensor) and temperature.numel() > 1:
            temperature = temperature.to(torch.float32)[torch.tensor(rows, device=temperature.device)]
        else:
            temperature = float(temperature)
        mask_outside_support(logits.view(-1, logits.shape[-1]), positions, supports, temperature)


def _wrap_prepare_model_outputs(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        apply_support_replay(output, micro_batch)
        return original(self, output, output_args, micro_batch, logits_processor_func)

    return prepare_model_outputs


def install() -> None:
    """Wrap ``FSDPEngineWithLMHead.prepare_model_outputs`` (idempotent; verl 0.9.1 only)."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    VERL_CURRENT.wrap(
        Wrap(
            FSDPEngineWithLMHead,
            "prepare_model_outputs",
            _wrap_prepare_model_outputs,
            PREPARE_MODEL_OUTPUTS_PARAMS,
            "FSDPEngineWithLMHead.prepare_model_outputs",
        )
    )
