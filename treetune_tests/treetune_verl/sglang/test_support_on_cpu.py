# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sampled support (issue 48, engine side, torch only): the installed sglang's own torch sampler as the
reference for what is sampled, and the support's rules written here.

- ``sample_with_support`` (our copy of the installed sglang's sampler) draws the same tokens as sglang's own
  ``top_k_top_p_min_p_sampling_from_probs_torch`` under the same RNG state, for every filter combination of the
  issue (top-p 0.8 / 0.95, top-k 5 / 20, min-p 0.1, their combinations, temperatures 0.7 and 1.3), rows that filter
  nothing in a batch that does, and the seeded path.
- Its support against a reference computed here: each row's probabilities sorted by descending value (the order the
  test takes from ``torch.sort``: sglang's tie rule is that order), then the rules of sglang's sampler stated and
  applied one position at a time: a position is kept when its rank is below top-k, when the mass before it is at most
  top-p (the token that crosses top-p is kept, one whose preceding mass equals top-p exactly too), and when its
  probability is at least min-p times the largest kept one. The mass before a position is the float32 running sum
  sglang's sampler forms (``torch.cumsum`` of the sorted float32 row, minus the position's own): at top-p = 1 the
  float64 mass of a row's tail exceeds 1 by ~1e-8 and would drop tokens that sglang keeps and may sample
  (:func:`test_float64_would_move_the_boundary_only_at_top_p_one` shows where).
- ``read_support``: sizes, ids, kept mass, the entropy renormalised over the support and the sampled token's
  renormalised log-probability, against float64 sums written here; the unfiltered case; refusals.
"""

from __future__ import annotations

import importlib.metadata
import math
from types import SimpleNamespace

import pytest
import torch

from treetune_verl.sglang.patching import UnsupportedSGLangError, upstream_value
from treetune_verl.sglang.support import read_support
from treetune_verl.sglang.support_sampling import sample_with_support

V = 64
TOP_K_ALL = 1 << 30  # sglang's "whole vocabulary" (sampling_params.TOP_K_ALL)
# (temperature, top_p, top_k, min_p) per row: the issue's values and their combinations, and rows that filter nothing
ROWS = [
    (0.7, 0.8, TOP_K_ALL, 0.0),
    (1.3, 0.95, TOP_K_ALL, 0.0),
    (0.7, 1.0, 5, 0.0),
    (1.3, 1.0, 20, 0.0),
    (0.7, 1.0, TOP_K_ALL, 0.1),
    (1.3, 0.8, 5, 0.0),
    (0.7, 0.95, 20, 0.1),
    (1.3, 0.8, 20, 0.1),
    (0.7, 1.0, TOP_K_ALL, 0.0),  # filters nothing, in a batch that filters
]


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tempered probabilities [n, V] float32 (softmax(logits / T), as sglang's sampler computes them) and the rows'
    top-k, top-p, min-p tensors as ``SamplingBatchInfo`` holds them."""
    generator = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(len(ROWS), V, generator=generator)
    temperatures = torch.tensor([[row[0]] for row in ROWS])
    probs = torch.softmax(logits / temperatures, dim=-1)
    top_ps = torch.tensor([row[1] for row in ROWS])
    top_ks = torch.tensor([row[2] for row in ROWS], dtype=torch.int32)
    min_ps = torch.tensor([row[3] for row in ROWS])
    return probs, top_ks, top_ps, min_ps


def reference_support(p: torch.Tensor, top_k: int, top_p: float, min_p: float) -> list[int]:
    """The token ids sglang's rules keep for one row, in descending probability (module docstring)."""
    ordered, order = torch.sort(p, descending=True)
    before = (torch.cumsum(ordered, dim=0) - ordered).tolist()  # float32, as sglang's sampler forms it
    values = ordered.tolist()
    kept = [rank for rank in range(len(values)) if rank < top_k and before[rank] <= top_p]
    largest = values[kept[0]]
    return [int(order[r]) for r in kept if values[r] >= min_p * largest]


def _upstream():
    from sglang.srt.layers import sampler

    # upstream's, also when an Engine of this session bound our copy to its name (mode "support" on 0.5.12 applies
    # the scheduler's hooks in the parent too)
    return upstream_value(sampler, "top_k_top_p_min_p_sampling_from_probs_torch")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_copy_samples_what_sglang_samples_and_its_support_follows_sglangs_rules(seed):
    probs, top_ks, top_ps, min_ps = _batch(seed)
    for draw in range(20):
        torch.manual_seed(1000 * seed + draw)
        upstream = _upstream()(probs.clone(), top_ks, top_ps, min_ps, True, None, torch.zeros(len(ROWS)))
        torch.manual_seed(1000 * seed + draw)
        ids, weights, order = sample_with_support()(probs, top_ks, top_ps, min_ps, True, None, torch.zeros(len(ROWS)))
        assert torch.equal(ids, upstream)
        support = read_support(weights, ids, order)
        for i, (_, top_p, top_k, min_p) in enumerate(ROWS):
            expected = reference_support(probs[i], top_k, top_p, min_p)
            assert support.token_ids[i].tolist() == expected
            assert int(ids[i]) in expected
    # the rows that filter nothing keep every token of positive probability
    assert support.sizes[-1] == int((probs[-1] > 0).sum())


def test_the_top_p_boundary_and_ties_are_sglangs():
    """Probabilities exact in float32: the token whose preceding mass equals top-p is kept (sglang zeroes only where
    the mass before a token exceeds top-p); with ties at the top-k cut the support holds exactly k of them, the ones
    ``torch.sort`` puts first, and sglang's own sampler never draws another."""
    halves = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]])  # dyadic: every prefix sum exact
    ids, weights, order = sample_with_support()(
        halves, torch.tensor([TOP_K_ALL]), torch.tensor([0.75]), torch.tensor([0.0]), False, None, torch.zeros(1)
    )
    assert read_support(weights, ids, order).token_ids[0].tolist() == [0, 1, 2]  # mass before token 2 is 0.75
    # min-p's boundary: a probability equal to min-p times the largest is kept (float32(0.1) / 2 == float32(0.05))
    at_min_p = torch.tensor([[0.5, 0.25, 0.05, 0.2]])
    ids, weights, order = sample_with_support()(
        at_min_p, torch.tensor([TOP_K_ALL]), torch.tensor([1.0]), torch.tensor([0.1]), True, None, None
    )
    assert sorted(read_support(weights, ids, order).token_ids[0].tolist()) == [0, 1, 2, 3]
    ids, weights, order = sample_with_support()(
        at_min_p, torch.tensor([TOP_K_ALL]), torch.tensor([1.0]), torch.tensor([0.11]), True, None, None
    )
    assert sorted(read_support(weights, ids, order).token_ids[0].tolist()) == [0, 1, 3]
    tied = torch.tensor([[0.1, 0.2, 0.2, 0.2, 0.2, 0.1]])
    first_two = torch.sort(tied[0], descending=True).indices[:2].tolist()
    drawn = set()
    for draw in range(200):
        torch.manual_seed(draw)
        upstream = _upstream()(tied, torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.0]), False, None, None)
        torch.manual_seed(draw)
        ids, weights, order = sample_with_support()(
            tied, torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.0]), False, None, None
        )
        assert torch.equal(ids, upstream)
        assert read_support(weights, ids, order).token_ids[0].tolist() == first_two
        drawn.add(int(upstream[0]))
    assert drawn == set(first_two)


def test_float64_would_move_the_boundary_only_at_top_p_one():
    """Why the reference forms the mass before a position in float32: over these batches a float64 sum changes a
    row's support only where top-p is 1 (the float32 probabilities sum to 1 + ~1e-8), never at 0.8 or 0.95."""
    moved = set()
    for seed in range(3):
        probs, _, _, _ = _batch(seed)
        for i, (_, top_p, _, _) in enumerate(ROWS):
            ordered = torch.sort(probs[i], descending=True).values
            as_float32 = int(((torch.cumsum(ordered, 0) - ordered) <= top_p).sum())
            wide = ordered.double()
            as_float64 = int(((torch.cumsum(wide, 0) - wide) <= top_p).sum())
            if as_float32 != as_float64:
                moved.add(top_p)
    assert moved == {1.0}


def test_the_seeded_path_samples_what_sglang_samples():
    """Deterministic sampling (a per-request seed): the copy's draw is upstream's (0.5.12 refuses min-p there)."""
    probs, top_ks, top_ps, _ = _batch(3)
    no_min_p = torch.zeros(len(ROWS))
    seeds = torch.arange(len(ROWS), dtype=torch.int64) + 17
    positions = torch.arange(len(ROWS), dtype=torch.int64) + 5
    try:
        upstream = _upstream()(probs.clone(), top_ks, top_ps, no_min_p, False, seeds, positions)
    except RuntimeError as error:  # sglang 0.5.12 hashes the seeds with a triton kernel: no driver on a CPU machine
        if "active drivers" not in str(error):
            raise
        pytest.skip(f"sglang's seeded sampling needs a GPU driver here: {error}")
    ids, weights, order = sample_with_support()(probs, top_ks, top_ps, no_min_p, False, seeds, positions)
    assert torch.equal(ids, upstream)
    read_support(weights, ids, order)  # every sampled token inside its support


def test_read_support_against_sums_written_here():
    probs, top_ks, top_ps, min_ps = _batch(4)
    torch.manual_seed(0)
    ids, weights, order = sample_with_support()(probs, top_ks, top_ps, min_ps, True, None, None)
    support = read_support(weights, ids, order)
    for i, (_, top_p, top_k, min_p) in enumerate(ROWS):
        kept = reference_support(probs[i], top_k, top_p, min_p)
        p = probs[i].double()[kept]
        q = p / p.sum()
        assert int(support.sizes[i]) == len(kept)
        assert float(support.kept_mass[i]) == pytest.approx(float(p.sum()), abs=1e-6)
        assert float(support.entropy[i]) == pytest.approx(float(-(q * q.log()).sum()), abs=1e-5)
        assert float(support.sampled_logprob[i]) == pytest.approx(math.log(float(q[kept.index(int(ids[i]))])), abs=1e-5)
        assert float(support.entropy[i]) <= math.log(len(kept)) + 1e-6
    # unfiltered: drawn from the whole tempered distribution, no ids stored, its entropy the full one
    full = read_support(probs, ids.long())
    assert full.token_ids == (None,) * len(ROWS)
    full_entropy = -(probs.double() * probs.double().log()).sum(-1)
    assert torch.allclose(full.entropy.double(), full_entropy, atol=1e-5)
    assert torch.allclose(full.sampled_logprob.double(), probs.double().log()[torch.arange(len(ROWS)), ids.long()])


def test_read_support_refuses_what_does_not_fit():
    weights = torch.tensor([[0.6, 0.4, 0.0]])
    order = torch.tensor([[2, 0, 1]])
    with pytest.raises(ValueError, match="outside the support"):
        read_support(weights, torch.tensor([1]), order)  # token 1 sits at a zeroed position
    with pytest.raises(ValueError, match="no positive weight"):
        read_support(torch.zeros(1, 3), torch.tensor([0]), order)
    with pytest.raises(ValueError, match="outside the support"):
        read_support(weights, torch.tensor([7]), order)  # not in the order at all
    with pytest.raises(ValueError, match="not a prefix"):
        read_support(torch.tensor([[0.6, 0.0, 0.4]]), torch.tensor([2]), order)
    with pytest.raises(ValueError, match=r"weights \[n, V\]"):
        read_support(weights, torch.tensor([0, 1]), order)


def test_a_changed_upstream_sampler_is_refused_by_its_source(monkeypatch):
    from sglang.srt.layers import sampler

    def changed(probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions):
        return probs.argmax(-1)

    monkeypatch.setattr(sampler, "top_k_top_p_min_p_sampling_from_probs_torch", changed)
    with pytest.raises(UnsupportedSGLangError, match="the copy was made from"):
        sample_with_support()


def test_untruncated_rows_store_no_ids_and_each_token_travels_as_one_row():
    probs, top_ks, top_ps, min_ps = _batch(5)
    torch.manual_seed(0)
    ids, weights, order = sample_with_support()(probs, top_ks, top_ps, min_ps, True, None, None)
    whole = (top_ks >= V) & (top_ps >= 1.0) & (min_ps <= 0.0)
    assert whole.tolist() == [row[1:] == (1.0, TOP_K_ALL, 0.0) for row in ROWS]
    support = read_support(weights, ids, order, whole)
    for i, (entropy, (size, kept_mass, logprob, token_ids)) in enumerate(support.rows()):
        _, top_p, top_k, min_p = ROWS[i]
        kept = reference_support(probs[i], top_k, top_p, min_p)
        assert size == len(kept)
        assert token_ids == (None if whole[i] else kept)  # by descending probability
        assert (entropy, kept_mass, logprob) == pytest.approx(
            (float(support.entropy[i]), float(support.kept_mass[i]), float(support.sampled_logprob[i]))
        )


def test_binding_the_copy_in_sglangs_name_is_idempotent_and_samples_as_upstream():
    from sglang.srt.layers import sampler

    from treetune_verl.patching import restore
    from treetune_verl.sglang.support_capture import install_support_sampling

    name = "top_k_top_p_min_p_sampling_from_probs_torch"
    upstream = upstream_value(sampler, name)
    probs, top_ks, top_ps, min_ps = _batch(6)
    try:
        install_support_sampling()
        bound = getattr(sampler, name)
        assert bound is not upstream
        install_support_sampling()
        assert getattr(sampler, name) is bound
        sample_with_support()  # the source check reads upstream's function behind our binding
        torch.manual_seed(0)
        ours = bound(probs.clone(), top_ks, top_ps, min_ps, True, None, None)
        torch.manual_seed(0)
        assert torch.equal(ours, upstream(probs.clone(), top_ks, top_ps, min_ps, True, None, None))
    finally:
        restore(sampler, name)
    assert getattr(sampler, name) is upstream


def test_mode_support_is_refused_where_sglang_samples_elsewhere():
    from treetune_verl.rollout.rollout_config import entropy_config
    from treetune_verl.sglang.config import EntropyConfig
    from treetune_verl.sglang.server_args import check_server_args

    assert EntropyConfig(mode="support").mode == "support"
    with pytest.raises(ValueError, match="top_k=5 with mode 'support'"):
        EntropyConfig(top_k=5, mode="support")
    check_server_args(SimpleNamespace(sampling_backend="pytorch"), mode="support")
    for field, value, message in [
        ("sampling_backend", "flashinfer", "sampling_backend='flashinfer' with entropy mode 'support'"),
        ("enable_deterministic_inference", True, "enable_deterministic_inference with entropy mode 'support'"),
        ("enable_custom_logit_processor", True, "enable_custom_logit_processor with entropy mode 'support'"),
    ]:
        settings = SimpleNamespace(**{"sampling_backend": "pytorch", field: value})
        check_server_args(settings, mode="tempered")  # the other modes read the logits before any of them
        with pytest.raises(UnsupportedSGLangError, match=message):
            check_server_args(settings, mode="support")
    from treetune_verl.rollout.rollout_config import support_replay

    with pytest.raises(ValueError, match="replay is the sampled support's replay: it needs"):
        support_replay({"custom": {"entropy": {"mode": "tempered", "replay": False}}})
    rollout = {"calculate_log_probs": True, "custom": {"entropy": {"mode": "support"}}}
    assert entropy_config(rollout).mode == "support" and support_replay(rollout)  # replay: on by default
    with pytest.raises(ValueError, match="replay must be true or false, got 'no'"):
        support_replay({**rollout, "custom": {"entropy": {"mode": "support", "replay": "no"}}})
    if importlib.metadata.version("verl") == "0.7.1":  # its replay seams come with our actor entry point
        from omegaconf import OmegaConf

        from treetune_verl.verl.v0_7_1.trainer_setup import install

        with pytest.raises(
            ValueError, match="installed by our actor entry point: set actor_rollout_ref.model.external_lib"
        ):
            install(OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}}))
