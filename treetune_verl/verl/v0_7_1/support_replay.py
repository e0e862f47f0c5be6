# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""verl 0.7.1's actor over the sampled support (issue 48, entropy mode ``support``): each response token's logits
masked outside the support sglang sampled it from, before verl's temperature, log-softmax and entropy.

The rows carry their supports in ``non_tensor_batch["response_support"]`` (object ``[B]``: a row's list of
``(size, kept_mass, sampled_logprob, token_ids | None)``, one per response token, or ``None``; built by the rollout
entropy worker, ``agent_loop/entropy_worker.py``). Two seams of ``DataParallelPPOActor``:

- ``compute_log_prob`` (and ``update_policy``, in ``actor_seams.py``): verl selects a fixed list of keys there
  (``dp_actor.py`` ``data.select``), which would drop the column; for the call, the instance's ``select`` keeps it;
- ``_forward_micro_batch`` (old log-probs, the update and the reference model alike): for the call, a forward hook on
  ``actor_module`` masks ``output.logits`` (``ppo/support_replay.py``) before verl divides them by the temperature.

Layout: verl 0.7.1's padded rows (left-padded prompts, right-padded responses), response token ``j`` predicted at
input position ``S - R - 1 + j`` for every row (``S`` the sequence length, ``R`` the response length); only
positions whose response token is real (``attention_mask``) are masked (a row emptied by over-sampling has none).
Refused: ``use_remove_padding`` (the packed order is not mapped yet), fused kernels (no logits), the prefix grouper.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from treetune_verl.batch_keys import RESPONSE_SUPPORT_KEY
from treetune_verl.patching import swapped
from treetune_verl.ppo.support_replay import mask_outside_support
from treetune_verl.sglang.support import TOKEN_SUPPORT_FIELDS

__all__ = ["keeping_supports", "padded_positions", "wrap_compute_log_prob", "wrap_forward_micro_batch"]

COMPUTE_LOG_PROB_PARAMS = ("self", "data", "calculate_entropy")  # verl 0.7.1 workers/actor/dp_actor.py
FORWARD_MICRO_BATCH_PARAMS = ("self", "micro_batch", "temperature", "calculate_entropy")
_IDS = TOKEN_SUPPORT_FIELDS.index("token_ids")


@contextlib.contextmanager
def keeping_supports(data: Any) -> Iterator[None]:
    """For the duration, ``data.select`` keeps the supports column beside the keys verl selects (nothing to do
    where the batch has none)."""
    if RESPONSE_SUPPORT_KEY not in getattr(data, "non_tensor_batch", {}):
        yield
        return
    select = data.select

    def select_with_supports(batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None, deepcopy=False):
        keys = list(non_tensor_batch_keys or [])
        return select(batch_keys, [*keys, RESPONSE_SUPPORT_KEY], meta_info_keys, deepcopy)

    with swapped(data, "select", select_with_supports):
        yield


def padded_positions(
    supports: Any, responses: torch.Tensor, response_attention: torch.Tensor, sequence_length: int
) -> tuple[torch.Tensor, list[list[int]]]:
    """The rows of ``logits.view(B * S, V)`` to mask and each one's support.

    Args:
        supports: object ``[B]``, each row's supports (module docstring) or ``None``.
        responses: ``[B, R]`` the response token ids (right-padded).
        response_attention: ``[B, R]`` 1 at real response tokens (the response part of ``attention_mask``).
        sequence_length: ``S``, prompt and response.

    Raises:
        ValueError: a real response token outside its own support, or a row with fewer supports than real tokens.
    """
    positions, kept = [], []
    response_length = responses.shape[1]
    for i, row in enumerate(supports):
        if row is None:
            continue
        real = response_attention[i].nonzero().flatten().tolist()
        if real and real[-1] >= len(row):
            raise ValueError(f"row {i}: {len(row)} supports for {real[-1] + 1} response tokens")
        first = i * sequence_length + sequence_length - response_length - 1
        for j in real:
            ids = row[j][_IDS]
            if ids is None:
                continue  # drawn from the whole tempered distribution
            token = int(responses[i, j])
            if token not in ids:
                raise ValueError(f"row {i}, response token {j} (id {token}) lies outside its sampled support")
            positions.append(first + j)
            kept.append(list(ids))
    return torch.tensor(positions, dtype=torch.int64), kept


def wrap_compute_log_prob(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute_log_prob(self, data, calculate_entropy=False):
        with keeping_supports(data):
            return original(self, data, calculate_entropy)

    return compute_log_prob


def wrap_forward_micro_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _forward_micro_batch(self, micro_batch, temperature, calculate_entropy=False):
        supports = micro_batch.get(RESPONSE_SUPPORT_KEY)
        if supports is None or all(row is None for row in supports):
            return original(self, micro_batch, temperature, calculate_entropy)
        refused = [
            name
            for name, on in (
                ("use_remove_padding", self.use_remove_padding),
                ("use_fused_kernels", self.use_fused_kernels),
                ("the prefix grouper", getattr(self, "use_prefix_grouper", False)),
            )
            if on
        ]
        if refused:
            raise ValueError(
                f"support replay on verl 0.7.1 does not run with {', '.join(refused)} yet (the padded actor only); "
                "turn it off, or use rollout.custom.entropy.mode raw / tempered"
            )
        responses = micro_batch["responses"]
        input_ids = micro_batch["input_ids"]
        positions, kept = padded_positions(
            supports, responses, micro_batch["attention_mask"][:, -responses.shape[1] :], input_ids.shape[1]
        )

        def mask(module, args, output):
            logits = output.logits
            mask_outside_support(logits.view(-1, logits.shape[-1]), positions, kept, temperature)

        handle = self.actor_module.register_forward_hook(mask)
        try:
            return original(self, micro_batch, temperature, calculate_entropy)
        finally:
            handle.remove()

    return _forward_micro_batch
