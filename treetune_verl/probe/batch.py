# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The probe batch: B prompts with G responses each, as padded tensors.

Shape notation:
    B = prompts, G = responses per prompt
    P = prompt width (longest prompt of the batch), R = response width (longest response of the batch)
    T = P + R

Layout. Every row is ``[left pad | prompt | response | right pad]`` with the prompt right-aligned at column P, so all
responses start at the common column P. Keys:

    sequences        [B, G, T] long   token ids, pad_token_id in padding
    attention_masks  [B, G, T] long   1 on prompt and response tokens, 0 on padding
    prompt_lens      [B]       long   real (unpadded) prompt length of each prompt
    advantages       [B, G]    fp32   advantage of each response
    max_lengths      [B]       long   L_max(prompt): the per-prompt length normaliser (see below)

Worked example (pad = 0): ``prompt_ids = [[5, 6, 7], [8]]``,
``response_ids = [[[1, 2], [3]], [[4, 4, 4], [9]]]`` gives P = 3, R = 3, T = 6 and::

    sequences[0] = [[5, 6, 7, 1, 2, 0],      attention_masks[0] = [[1, 1, 1, 1, 1, 0],
                    [5, 6, 7, 3, 0, 0]]                             [1, 1, 1, 1, 0, 0]]
    sequences[1] = [[0, 0, 8, 4, 4, 4],      attention_masks[1] = [[0, 0, 1, 1, 1, 1],
                    [0, 0, 8, 9, 0, 0]]                             [0, 0, 1, 1, 0, 0]]
    prompt_lens = [3, 1]; max_lengths (default) = [2, 3]

The response of row (b, g) is ``sequences[b, g, P : P + L[b, g]]`` with ``L = attention_masks[..., P:].sum(-1)``;
the response token in column c is predicted by the logits of column c - 1.

L_max. The estimators divide per-prompt quantities by ``max_lengths[b]``. They are exactly unbiased for the gradient
of E[H_seq(x) / L_max(x)] when L_max(x) does not depend on the sampled responses: a fixed response length, or the
generation budget (``max_new_tokens``, what the main job passes). The default, the longest response of the prompt's
group (the seed documents' convention), is itself random, so with variable lengths it makes the normalised
estimators slightly biased (a ratio-estimator bias of order 1/G).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

BATCH_KEYS = ("sequences", "attention_masks", "prompt_lens", "advantages", "max_lengths")


def check_group_size(G: int, setting: str, baseline: str) -> None:
    """Raise ``ValueError`` unless G >= 2: ``setting`` (``key=value``) baselines each response by ``baseline``."""
    if G < 2:
        raise ValueError(f"{setting} uses {baseline} over the G responses of a prompt: needs batch.G >= 2, got G={G}")


def make_probe_batch(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[Sequence[int]]],
    advantages: Sequence[Sequence[float]] | torch.Tensor,
    pad_token_id: int,
    max_lengths: Sequence[int] | torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Build a probe batch (CPU tensors, layout in the module docstring) from plain token lists.

    Args:
        prompt_ids: ``prompt_ids[b]`` is the token list of prompt b (non-empty).
        response_ids: ``response_ids[b][g]`` is the token list of response g of prompt b (non-empty; same G for
            every prompt). An EOS token, if the response has one, is part of the response.
        advantages: ``[B][G]`` advantages.
        pad_token_id: id written into padding (never attended to, never scored).
        max_lengths: ``[B]`` per-prompt L_max; default: the longest response of each prompt's group.

    Raises:
        ValueError: on ragged G, empty prompts or responses, mismatched lengths, or ``max_lengths`` shorter than a
            response of its prompt.
    """
    B = len(prompt_ids)
    if B == 0:
        raise ValueError("make_probe_batch: prompt_ids is empty (need at least one prompt)")
    if len(response_ids) != B:
        raise ValueError(f"make_probe_batch: {B} prompts but response_ids has {len(response_ids)} groups")
    G = len(response_ids[0])
    for b in range(B):
        if len(prompt_ids[b]) == 0:
            raise ValueError(f"make_probe_batch: prompt {b} is empty")
        if len(response_ids[b]) != G:
            raise ValueError(
                f"make_probe_batch: prompt 0 has G={G} responses but prompt {b} has {len(response_ids[b])}"
            )
        for g, response in enumerate(response_ids[b]):
            if len(response) == 0:
                raise ValueError(
                    f"make_probe_batch: response {g} of prompt {b} is empty (every response needs >= 1 token)"
                )
    if G == 0:
        raise ValueError("make_probe_batch: G = 0 responses per prompt")

    adv = torch.as_tensor(advantages, dtype=torch.float32)
    if adv.shape != (B, G):
        raise ValueError(f"make_probe_batch: advantages must have shape [B, G] = [{B}, {G}], got {list(adv.shape)}")

    P = max(len(p) for p in prompt_ids)
    R = max(len(r) for group in response_ids for r in group)
    T = P + R
    sequences = torch.full((B, G, T), pad_token_id, dtype=torch.long)
    masks = torch.zeros((B, G, T), dtype=torch.long)
    gen_lens = torch.zeros((B, G), dtype=torch.long)
    for b in range(B):
        prompt = torch.as_tensor(list(prompt_ids[b]), dtype=torch.long)
        for g in range(G):
            response = torch.as_tensor(list(response_ids[b][g]), dtype=torch.long)
            sequences[b, g, P - len(prompt) : P] = prompt
            sequences[b, g, P : P + len(response)] = response
            masks[b, g, P - len(prompt) : P + len(response)] = 1
            gen_lens[b, g] = len(response)

    longest = gen_lens.max(dim=1).values
    if max_lengths is None:
        lmax = longest.clone()
    else:
        lmax = torch.as_tensor(max_lengths, dtype=torch.long).reshape(-1)
        if lmax.shape != (B,):
            raise ValueError(f"make_probe_batch: max_lengths must have shape [B] = [{B}], got {list(lmax.shape)}")
        short = (lmax < longest).nonzero().flatten().tolist()
        if short:
            b = short[0]
            raise ValueError(
                f"make_probe_batch: max_lengths[{b}] = {int(lmax[b])} is shorter than the longest response of "
                f"prompt {b} ({int(longest[b])} tokens)"
            )
    return {
        "sequences": sequences,
        "attention_masks": masks,
        "prompt_lens": torch.tensor([len(p) for p in prompt_ids], dtype=torch.long),
        "advantages": adv,
        "max_lengths": lmax,
    }


def response_start(batch: dict[str, torch.Tensor]) -> int:
    """Common response column P of a validated batch (leading pads + prompt length of row 0)."""
    first_real = int(batch["attention_masks"][0, 0].argmax())
    return first_real + int(batch["prompt_lens"][0])


def validate_probe_batch(batch: dict[str, torch.Tensor], name: str = "batch") -> tuple[int, int, int]:
    """Check shapes and the padding layout; return ``(B, G, P)``.

    Raises:
        ValueError: naming the offending key, for missing keys, mismatched shapes, a layout other than the module
            docstring's, an empty response, or non-positive / too short ``max_lengths``.
    """
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"{name}: missing keys {missing} (expected {list(BATCH_KEYS)})")
    seq, mask = batch["sequences"], batch["attention_masks"]
    if seq.dim() != 3:
        raise ValueError(f"{name}: sequences must be [B, G, T], got shape {list(seq.shape)}")
    B, G, T = seq.shape
    if B == 0 or G == 0:
        raise ValueError(f"{name}: sequences has an empty dimension, shape {list(seq.shape)}")
    expected = {
        "attention_masks": (B, G, T),
        "prompt_lens": (B,),
        "advantages": (B, G),
        "max_lengths": (B,),
    }
    for key, shape in expected.items():
        if tuple(batch[key].shape) != shape:
            raise ValueError(
                f"{name}: {key} must have shape {list(shape)} to match sequences {list(seq.shape)}, "
                f"got {list(batch[key].shape)}"
            )
    m = mask.bool()
    if not m.any(dim=-1).all():
        raise ValueError(f"{name}: some row of attention_masks is all zero")
    first_real = m.long().argmax(dim=-1)  # [B, G]
    starts = first_real + batch["prompt_lens"].view(B, 1)
    P = int(starts[0, 0])
    if not (starts == P).all():
        raise ValueError(
            f"{name}: responses must start at one common column (prompts left-padded to a common width); "
            f"got start columns {sorted(set(starts.flatten().tolist()))}"
        )
    if P >= T:
        raise ValueError(f"{name}: no room for responses (prompt width {P} >= T = {T})")
    # Contiguity: the mask must be 1 exactly on [P - prompt_len, P + L) for each row.
    gen_lens = m[..., P:].sum(dim=-1)
    cols = torch.arange(T).view(1, 1, T)
    lo = (P - batch["prompt_lens"]).view(B, 1, 1)
    expected_mask = (cols >= lo) & (cols < P + gen_lens.unsqueeze(-1))
    if not torch.equal(expected_mask, m):
        raise ValueError(f"{name}: attention_masks must be [0...0 1...1 (prompt) 1...1 (response) 0...0] per row")
    if (gen_lens == 0).any():
        b, g = (gen_lens == 0).nonzero()[0].tolist()
        raise ValueError(f"{name}: response {g} of prompt {b} is empty (every response needs >= 1 token)")
    lmax = batch["max_lengths"]
    if (lmax < gen_lens.max(dim=1).values).any():
        raise ValueError(f"{name}: max_lengths must be >= the longest response of each prompt")
    if not torch.isfinite(batch["advantages"].float()).all():
        raise ValueError(f"{name}: advantages contain NaN or inf")
    return B, G, P


def iter_microbatches(batch: dict[str, torch.Tensor], mb_size_prompts: int) -> Iterator[dict[str, torch.Tensor]]:
    """Yield slices of ``mb_size_prompts`` prompts (all G responses of each) along the prompt dimension.

    Slices keep the full width T, so every microbatch has the same response column P as the batch.
    """
    if mb_size_prompts < 1:
        raise ValueError(f"probe.mb_size_prompts must be >= 1, got {mb_size_prompts}")
    B = batch["sequences"].shape[0]
    for start in range(0, B, mb_size_prompts):
        yield {k: batch[k][start : start + mb_size_prompts] for k in BATCH_KEYS}
