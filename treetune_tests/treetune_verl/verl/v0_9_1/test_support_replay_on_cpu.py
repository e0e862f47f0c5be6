# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Support replay in verl 0.9.1's real engine-worker actor (issue 48, verl side): ``compute_log_prob`` with the rows'
``extra_fields["response_support"]`` gives, at every response token sampled from a truncated support, the log-prob
and entropy of the actor's tempered distribution renormalised over that support, and verl's own values elsewhere.

Real: verl 0.9.1's ``ActorRolloutRefWorker`` (role ``actor``, FSDP2 on one gloo rank, float32, the padded layout of the
CPU e2e runs) built by its ``init_model``, with our seams installed as ``external_lib`` installs them; its
``compute_log_prob`` at temperature 0.7 with ``calculate_entropy``. The batch's rows: supports of 1 to 6 ids around
each response token, an untruncated token (``None``), a row without supports (another loop), in rows of different
lengths. The reference is computed here from a plain HF forward of the same weights: ``torch.log_softmax`` of the
tempered logits restricted to the support's ids (the full vocabulary where there is none), and its entropy.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from treetune_tests.treetune_verl.verl.v0_9_1.engine_actor import (
    CPU_RUNTIME,
    actor_config,
    join_process_group,
    v1_rows,
)
from treetune_tests.treetune_verl.verl.v0_9_1.test_engine_forecast_on_cpu import _free_port

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

PROMPT, TEMPERATURE = 3, 0.7
LENGTHS = [4, 2, 3, 1]  # response tokens per row


def _rows(vocab: int):
    """Prompts, responses and each row's ``extra_fields`` (row 3: none of ours; row 0 token 1: untruncated)."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, vocab, (PROMPT,), generator=gen) for _ in LENGTHS]
    responses = [torch.randint(2, vocab, (n,), generator=gen) for n in LENGTHS]
    extra_fields = []
    for i, response in enumerate(responses):
        if i == 3:
            extra_fields.append({"response_entropy": [1.0]})  # a loop that carries no supports
            continue
        support = []
        for j, token in enumerate(response.tolist()):
            if (i, j) == (0, 1):
                support.append((vocab, 1.0, -1.0, None))  # drawn from the whole distribution
                continue
            others = torch.randperm(vocab, generator=gen)[: (i + j) % 6].tolist()
            ids = list(dict.fromkeys([*others[: len(others) // 2], token, *others[len(others) // 2 :]]))
            support.append((len(ids), 0.5, -0.5, ids))
        extra_fields.append({"response_support": support})
    return prompts, responses, extra_fields


def _batch(prompts, responses, extra_fields):
    advantages = [torch.zeros(len(r)) for r in responses]
    return v1_rows(
        prompts,
        responses,
        advantages,
        len(prompts),
        extra_fields=extra_fields,
        temperature=TEMPERATURE,
        calculate_entropy=True,
    )


def _rank(rank: int, world: int, port: int, model_path: str, out_dir: str) -> None:
    join_process_group(rank, world, port)
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import response_from_nested

    import treetune_verl.verl.process_setup  # noqa: F401  (external_lib: installs the actor seams)
    from treetune_verl.patching import is_patched

    assert is_patched(FSDPEngineWithLMHead, "prepare_model_outputs")
    config = actor_config(model_path, PROMPT, max(LENGTHS), len(LENGTHS), 1, micro_rows=2, lr=1e-5, clip_grad=1.0)
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    vocab = worker.actor.model_config.hf_config.vocab_size
    prompts, responses, extra_fields = _rows(vocab)
    batch = _batch(prompts, responses, extra_fields)
    out = worker.compute_log_prob(batch.copy())
    mask = batch["response_mask"]
    result = {
        "log_probs": [t.clone() for t in response_from_nested(out["log_probs"], mask).unbind(0)],
        "entropy": [t.clone() for t in response_from_nested(out["entropy"], mask).unbind(0)],
        "rows": (prompts, responses, extra_fields),
        "weights": {
            k: v.full_tensor() if hasattr(v, "full_tensor") else v
            for k, v in worker.actor.engine.module.state_dict().items()
        },
    }
    torch.save(result, Path(out_dir) / "rank0.pt")
    torch.distributed.destroy_process_group()


@torch.no_grad()
def _reference(model_path: str, weights: dict, prompts, responses, extra_fields):
    """Per row, the log-prob of each response token and the entropy at its position, over its support (module
    docstring), from an HF forward of ``weights``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32, attn_implementation="sdpa")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied embeddings
    rows = []
    for prompt, response, fields in zip(prompts, responses, extra_fields, strict=True):
        ids = torch.cat([prompt, response])[None]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / TEMPERATURE  # [R, V]
        support = fields.get("response_support") or [None] * len(response)
        log_probs, entropy = [], []
        for j, token in enumerate(response.tolist()):
            kept = support[j][3] if support[j] is not None else None
            kept = list(range(logits.shape[-1])) if kept is None else kept
            logp = torch.log_softmax(logits[j, kept], dim=-1)
            log_probs.append(float(logp[kept.index(token)]))
            entropy.append(float(-(logp.exp() * logp).sum()))
        rows.append((log_probs, entropy))
    return rows


def test_the_actor_scores_each_token_over_its_sampled_support(tiny_model_dir, tmp_path, monkeypatch):
    for key, value in CPU_RUNTIME.items():
        monkeypatch.setenv(key, value)
    torch.multiprocessing.spawn(_rank, args=(1, _free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=1)
    result = torch.load(tmp_path / "rank0.pt", weights_only=False)
    prompts, responses, extra_fields = result["rows"]
    expected = _reference(str(tiny_model_dir), result["weights"], prompts, responses, extra_fields)
    truncated = 0
    for i, (log_probs, entropy) in enumerate(expected):
        assert result["log_probs"][i].tolist() == pytest.approx(log_probs, abs=1e-5), f"row {i}"
        assert result["entropy"][i].tolist() == pytest.approx(entropy, abs=1e-5), f"row {i}"
        support = extra_fields[i].get("response_support") or []
        truncated += sum(s[3] is not None and len(s[3]) < 6 for s in support)
    assert truncated >= 6  # the renormalised tokens are most of the batch: the comparison can fail
    # a one-token support: the token is certain over it
    one = [
        (i, j) for i, f in enumerate(extra_fields) for j, s in enumerate(f.get("response_support") or []) if s[0] == 1
    ]
    assert one and all(abs(float(result["log_probs"][i][j])) < 1e-6 for i, j in one)


def test_one_temperature_per_row_in_the_packed_layout():
    """verl 0.9.1 takes a temperature per sample (``micro_batch["temperature"]``, ``[B]``): each row's masked logits sit
    64 of its own temperature's nats below its largest kept one, at the packed positions that predict its tokens."""
    from types import SimpleNamespace

    from treetune_verl.verl.v0_9_1.support_replay import apply_support_replay

    prompts = [torch.tensor([3, 4, 5]), torch.tensor([6, 7])]
    responses = [torch.tensor([8, 9]), torch.tensor([10, 11, 12])]
    supports = [
        [(2, 0.5, -0.5, [8, 1]), (1, 0.5, 0.0, [9])],
        [(2, 0.5, -0.5, [10, 2]), (3, 0.5, -0.5, [11, 3, 4]), (1, 0.5, 0.0, [12])],
    ]
    advantages = [torch.zeros(len(r)) for r in responses]
    micro_batch = v1_rows(prompts, responses, advantages, 2, extra_fields=[{"response_support": s} for s in supports])
    micro_batch["temperature"] = torch.tensor([0.5, 2.0])  # no use_remove_padding: verl's default, the packed layout
    logits = 3 * torch.randn(1, 10, 30, generator=torch.Generator().manual_seed(0))  # 3 + 2 and 2 + 3 tokens
    output = SimpleNamespace(logits=logits.clone())
    apply_support_replay(output, micro_batch)
    # row 0's tokens are predicted at packed positions 2, 3; row 1's (offset 5, prompt 2) at 6, 7, 8
    expected = {2: (0.5, [8, 1]), 3: (0.5, [9]), 6: (2.0, [10, 2]), 7: (2.0, [11, 3, 4]), 8: (2.0, [12])}
    for position in range(10):
        got = output.logits[0, position]
        if position not in expected:
            assert torch.equal(got, logits[0, position])
            continue
        temperature, ids = expected[position]
        outside = [i for i in range(30) if i not in ids]
        assert torch.equal(got[ids], logits[0, position, ids])
        gap = got[outside] - logits[0, position, ids].max()
        assert torch.allclose(gap, torch.full_like(gap, -64 * temperature))
