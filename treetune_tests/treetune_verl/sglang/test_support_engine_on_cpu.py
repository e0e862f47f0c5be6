# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Mode ``support`` in a real ``sglang.Engine`` on CPU (issue 48, acceptance 1; both stacks: whichever sglang the
environment has): every token's sampled support, its renormalised log-probability and the entropy over it.

The reference is computed here, token by token, from the whole tempered distribution sglang sampled that token from:
sglang's own log-probabilities of every vocabulary entry at that position (``top_logprobs_num`` = the vocabulary:
``log(softmax(logits / T))`` as its sampler forms it, nothing of ours on that path). Their ``exp`` is sorted by
descending probability, the running mass is formed in float32 as sglang's sampler forms it, and sglang's rules are
applied one position at a time: kept while the rank is below top-k, while the mass before it is at most top-p (the
token crossing top-p kept), and while its probability is at least min-p times the largest. A token whose keep
decision is within ``BOUNDARY`` of flipping (the reference's probabilities are sglang's to one rounding, not bit
for bit) is not compared; the test reports how many there were and requires that they are rare.

Requests run concurrently in one Engine (batches mixing every filter combination of the issue, temperatures 0.7 and
1.3, a request that truncates nothing and a greedy one), then a batch that truncates nothing (sglang's untruncated
path) and an all-greedy batch (its argmax path).
"""

from __future__ import annotations

import math

import pytest
import torch

from treetune_tests.treetune_verl.sglang.engine_helpers import entropy_engine, entropy_state_in_scheduler

pytestmark = [pytest.mark.engine]

VOCAB = 429  # the tiny Qwen2's logits (its config's vocab_size; checked by the fixture)
TOKENS = 10
BOUNDARY = 1e-6  # a keep decision this close to its threshold is not compared (module docstring)
# (temperature, top_p, top_k, min_p): the values, their combinations, nothing truncated, greedy (T = 0)
MIXED = [
    (0.7, 0.8, -1, 0.0),
    (1.3, 0.95, -1, 0.0),
    (0.7, 1.0, 5, 0.0),
    (1.3, 1.0, 20, 0.0),
    (0.7, 1.0, -1, 0.1),
    (1.3, 0.8, 5, 0.0),
    (0.7, 0.95, 20, 0.1),
    (1.3, 0.8, 20, 0.1),
    (0.7, 1.0, -1, 0.0),
    (0.0, 1.0, -1, 0.0),
]
UNTRUNCATED = [(0.7, 1.0, -1, 0.0), (1.3, 1.0, -1, 0.0)]
GREEDY = [(0.0, 1.0, -1, 0.0), (0.0, 1.0, -1, 0.0)]


def _prompts(n: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randint(3, VOCAB, (5 + 3 * i,), generator=generator).tolist() for i in range(n)]


def _params(temperature: float, top_p: float, top_k: int, min_p: float) -> dict:
    return dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, max_new_tokens=TOKENS, ignore_eos=True)


def reference(position_logprobs: list, temperature: float, top_p: float, top_k: int, min_p: float) -> dict:
    """What sglang's rules keep at one position, from its full tempered log-probabilities (module docstring)."""
    if temperature == 0.0:  # sglang runs a greedy request at T = 1 with top-k 1
        top_k = 1
    if top_k < 0:
        top_k = VOCAB
    logprob = torch.full((VOCAB,), -math.inf)
    for value, token_id, _ in position_logprobs:
        logprob[token_id] = value
    p = logprob.exp()  # float32, as sglang's sampler holds them
    ordered, order = torch.sort(p, descending=True)
    before = (torch.cumsum(ordered, dim=0) - ordered).tolist()
    values = ordered.tolist()
    kept, closest = [], math.inf
    for rank, (value, mass_before) in enumerate(zip(values, before, strict=True)):
        if value <= 0.0 or rank >= top_k:
            break
        closest = min(closest, abs(mass_before - top_p) if top_p < 1.0 else math.inf)
        if mass_before > top_p:
            break
        kept.append(rank)
    largest = values[0]
    if min_p > 0:
        closest = min([closest, *(abs(values[r] - min_p * largest) for r in kept)])
        kept = [r for r in kept if values[r] >= min_p * largest]
    ids = [int(order[r]) for r in kept]
    q = p.double()[ids] / p.double()[ids].sum()
    return {
        "ids": ids,
        "whole": top_k >= VOCAB and top_p >= 1.0 and min_p <= 0.0,
        "probs": dict(zip(ids, q.tolist(), strict=True)),
        "entropy": float(-(q * q.log()).sum()),
        "kept_mass": float(p.double()[ids].sum()),
        "closest": closest,
    }


def check_request(out: dict, params: tuple[float, float, int, float]) -> tuple[int, int, float]:
    """Compare one finished request with the reference; returns (tokens compared, tokens at a boundary, the largest
    entropy difference)."""
    meta = out["meta_info"]
    tokens = [token_id for _, token_id, _ in meta["output_token_logprobs"]]
    supports, entropy, top = meta["output_token_support"], meta["output_token_entropy"], meta["output_top_logprobs"]
    assert len(supports) == len(entropy) == len(top) == len(tokens) == TOKENS
    compared, near, worst = 0, 0, 0.0
    for token, (size, kept_mass, logprob, ids), value, position in zip(tokens, supports, entropy, top, strict=True):
        ref = reference(position, *params)
        if ref["closest"] < BOUNDARY:
            near += 1
            continue
        compared += 1
        if ref["whole"]:  # the float32 running mass at top-p = 1 may drop a tail of ~1e-7: sizes differ there
            assert ids is None and size >= len(ref["ids"]) // 2
        else:
            assert ids is not None, f"{params} truncates: its ids are stored"
            assert size == len(ref["ids"]), (params, size, len(ref["ids"]))
            assert sorted(ids) == sorted(ref["ids"]), (params, ids, ref["ids"])
            assert ids[0] == ref["ids"][0]  # by descending probability
        assert token in ref["probs"], "the sampled token lies outside the support the rules keep"
        assert logprob == pytest.approx(math.log(ref["probs"][token]), abs=1e-5)
        assert kept_mass == pytest.approx(ref["kept_mass"], abs=1e-5)
        worst = max(worst, abs(value - ref["entropy"]))
        assert value <= math.log(size) + 1e-5
    return compared, near, worst


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from sglang.srt.layers import sampler
    from transformers import AutoConfig

    from treetune_verl.patching import restore

    assert AutoConfig.from_pretrained(tiny_model_dir).vocab_size == VOCAB
    try:
        with entropy_engine(tiny_model_dir, mode="support") as engine:
            yield engine
    finally:  # sglang 0.5.12 applies the scheduler's hooks in this process too: leave its sampler as it was
        restore(sampler, "top_k_top_p_min_p_sampling_from_probs_torch")


@pytest.mark.parametrize("batch", [MIXED, UNTRUNCATED, GREEDY], ids=["mixed", "untruncated", "greedy"])
def test_the_support_of_every_token_is_sglangs(engine, batch):
    outs = engine.generate(
        input_ids=_prompts(len(batch)),
        sampling_params=[_params(*p) for p in batch],
        return_logprob=True,
        top_logprobs_num=VOCAB,
    )
    compared = near = 0
    worst = 0.0
    for out, params in zip(outs, batch, strict=True):
        c, n, w = check_request(out, params)
        compared, near, worst = compared + c, near + n, max(worst, w)
    print(f"{compared} tokens compared, {near} at a boundary, largest entropy difference {worst:.2e} nats")
    assert near <= compared // 20
    assert worst <= 1e-5
    if batch is MIXED:  # every truncation of the issue stored its ids; the untruncated rows none
        sizes = [size for out in outs for size, *_ in out["meta_info"]["output_token_support"]]
        assert min(sizes) == 1 and max(sizes) > VOCAB // 2
    assert entropy_state_in_scheduler(engine) == 0


def test_requests_without_logprobs_get_no_support(engine):
    out = engine.generate(input_ids=_prompts(1)[0], sampling_params=_params(0.7, 0.8, -1, 0.0))
    assert "output_token_support" not in out["meta_info"]
    assert "output_token_entropy" not in out["meta_info"]
