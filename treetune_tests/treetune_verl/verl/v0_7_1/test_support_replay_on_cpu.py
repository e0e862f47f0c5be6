# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Support replay in verl 0.7.1's real ``DataParallelPPOActor`` (issue 48, verl side): ``compute_log_prob`` on a
``DataProto`` whose rows carry ``non_tensor_batch["response_support"]`` gives, at every response token sampled from a
truncated support, the log-prob and entropy of the tempered distribution renormalised over that support, and verl's
own values elsewhere; ``update_policy``'s gradients are those of the renormalised log-probs.

Real: verl 0.7.1's actor (padded layout, as the CPU e2e runs) on a tiny Qwen2, our seams installed as ``external_lib``
installs them (``actor_seams.install``). Rows: supports of 1 to 6 ids around each response token, an untruncated
token (``None``), a row without supports, a row emptied by over-sampling (its response all padding). The reference is
this test's own forward of the same model: ``torch.log_softmax`` of the tempered logits restricted to the support's
ids (the full vocabulary where there is none).
"""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.7.1", reason="verl 0.7.1 (the pinned stack)")

PROMPT, RESPONSE, VOCAB, TEMPERATURE = 3, 4, 32, 0.7
LENGTHS = [4, 2, 3, 0, 1]  # row 3: emptied by over-sampling


@pytest.fixture
def actor(monkeypatch):
    import torch.distributed as dist
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config import FSDPActorConfig, FSDPEngineConfig

    from treetune_tests.tiny_model import tiny_causal_lm
    from treetune_verl.verl.v0_7_1.actor_seams import install

    install()
    if not (dist.is_available() and dist.is_initialized()):
        monkeypatch.setattr(dist, "get_rank", lambda *args, **kwargs: 0)  # dp_actor prints the rank
    model = tiny_causal_lm("qwen2", VOCAB, 16, lm_head_std=0.5, pad_token_id=0, bos_token_id=None, eos_token_id=1)
    config = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=len(LENGTHS),
        ppo_micro_batch_size_per_gpu=2,
        use_dynamic_bsz=False,
        loss_agg_mode="token-mean",
        entropy_coeff=0.0,
        use_kl_loss=False,
        ppo_epochs=1,
        rollout_n=1,
        use_torch_compile=False,
        use_remove_padding=False,
        grad_clip=1e9,
        fsdp_config=FSDPEngineConfig(dtype="float32"),
    )
    return DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=0.0))


def _data():
    from verl.protocol import DataProto

    gen = torch.Generator().manual_seed(3)
    rows = len(LENGTHS)
    input_ids = torch.randint(2, VOCAB, (rows, PROMPT + RESPONSE), generator=gen)
    response_mask = (torch.arange(RESPONSE)[None, :] < torch.tensor(LENGTHS)[:, None]).to(torch.int64)
    input_ids[:, PROMPT:] = torch.where(response_mask.bool(), input_ids[:, PROMPT:], 0)  # right-padded responses
    attention_mask = torch.cat([torch.ones(rows, PROMPT, dtype=torch.int64), response_mask], dim=1)
    supports = np.empty(rows, dtype=object)
    for i, length in enumerate(LENGTHS):
        if i == 2:
            continue  # a row from a loop that carries none
        row = []
        for j in range(max(length, 1 if i == 3 else 0)):  # row 3 keeps its one support: its token was emptied
            token = int(input_ids[i, PROMPT + j])
            if (i, j) == (0, 1):
                row.append((VOCAB, 1.0, -1.0, None))
                continue
            others = torch.randperm(VOCAB, generator=gen)[: (i + j) % 6].tolist()
            ids = list(dict.fromkeys([*others[: len(others) // 2], token, *others[len(others) // 2 :]]))
            row.append((len(ids), 0.5, -0.5, ids))
        supports[i] = row
    data = DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, PROMPT:],
            "response_mask": response_mask,
            "advantages": torch.randn(rows, RESPONSE, generator=gen) * response_mask,
            "old_log_probs": torch.zeros(rows, RESPONSE),
        },
        non_tensors={"response_support": supports},
        meta_info={"temperature": TEMPERATURE, "pad_token_id": 0, "micro_batch_size": 2, "use_dynamic_bsz": False},
    )
    return data, supports


def _reference(model, data, supports) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, RESPONSE] log-probs of the response tokens and entropies, over each token's support (module docstring)."""
    batch = data.batch
    logits = (
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"])
        .logits[:, PROMPT - 1 : -1]
        .double()
        / TEMPERATURE
    )
    log_probs, entropy = torch.zeros(logits.shape[:2]), torch.zeros(logits.shape[:2])
    for i in range(logits.shape[0]):
        for j in range(RESPONSE):
            row = supports[i]
            kept = row[j][3] if row is not None and j < LENGTHS[i] and row[j][3] is not None else list(range(VOCAB))
            logp = torch.log_softmax(logits[i, j, kept], dim=-1)
            token = int(batch["responses"][i, j])
            log_probs[i, j] = logp[kept.index(token)] if token in kept else float("nan")
            entropy[i, j] = -(logp.exp() * logp).sum()
    return log_probs, entropy


def test_the_actor_scores_each_token_over_its_sampled_support(actor):
    data, supports = _data()
    out = actor.compute_log_prob(data, calculate_entropy=True)
    log_probs, entropy = _reference(actor.actor_module, data, supports)
    real = data.batch["response_mask"].bool()
    torch.testing.assert_close(out["log_probs"][real], log_probs[real].float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(out["entropys"][real], entropy[real].float(), atol=1e-5, rtol=0)
    truncated = sum(
        s[3] is not None and len(s[3]) < 6 for i, row in enumerate(supports) if row for s in row[: LENGTHS[i]]
    )
    assert truncated >= 5  # renormalised tokens are most of the batch: the comparison can fail
    certain = [(i, j) for i, row in enumerate(supports) if row for j, s in enumerate(row[: LENGTHS[i]]) if s[0] == 1]
    assert certain and all(abs(float(out["log_probs"][i, j])) < 1e-6 for i, j in certain)  # one id: certain


def test_update_policy_keeps_the_supports_through_verls_select(actor, monkeypatch):
    from treetune_verl.verl.v0_7_1 import support_replay

    seen = []
    forward = support_replay.padded_positions

    def spy(*args, **kwargs):
        seen.append(args[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(support_replay, "padded_positions", spy)
    data, _ = _data()
    actor.update_policy(data)
    assert len(seen) == 3  # every micro-batch of the update (5 rows, 2 per micro-batch) saw its rows' supports


def test_refused_where_the_padded_actor_does_not_run(actor):
    data, _ = _data()
    actor.use_remove_padding = True
    with pytest.raises(ValueError, match="does not run with use_remove_padding yet"):
        actor.compute_log_prob(data, calculate_entropy=True)
