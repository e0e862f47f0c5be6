# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``sampler``: the ``EntropySampler`` that a real sglang 0.5.6.post2 ``ModelRunner`` builds records the entropy of
the logits *before* the real ``Sampler.forward`` mutates them, and leaves sampling untouched.

The sampler under test is the one a real, fully built ``Scheduler`` (``real_scheduler``) got from its ``ModelRunner``
after ``apply_scheduler_patches``; it runs its real ``forward`` on CPU on a real ``LogitsProcessorOutput`` and a
``SamplingBatchInfo`` built by sglang from real ``Req`` objects (greedy, temperature, top-k/top-p rows).

References: the entropy is checked against :func:`reference_entropy`, written here in float64 (sorted top-k,
``softmax``, explicit ``-sum p log p``; product code is not called); the ids and logprobs against sglang's own
unpatched ``Sampler`` under the same seed and against ``log_softmax(logits / T)``. A spy on the formula shows that it
received exactly the untouched logits and that its result is what is attached.
"""

from __future__ import annotations

import pytest
import torch
from sglang.srt.layers import sampler as sampler_mod
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor import model_runner as model_runner_mod
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

from treetune_tests.treetune_verl.sglang.sglang_objects import VOCAB, make_req
from treetune_verl.sglang import sampler as sampler_patch
from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import original_of
from treetune_verl.sglang.sampler import LOGITS_OUTPUT_ENTROPY_ATTR
from treetune_verl.sglang.v0_5_6_post2.scheduler_patches import apply_scheduler_patches

CONFIGS = {
    "raw": EntropyConfig(),
    "tempered": EntropyConfig(mode="tempered"),
    "top_k": EntropyConfig(top_k=5),
}
# Per-row sampling parameters of one batch: sglang builds SamplingBatchInfo from them (temperature 0 = greedy).
PATHS = {
    "greedy": [dict(temperature=0.0)] * 4,
    "temperature": [dict(temperature=t) for t in (0.7, 1.3, 0.5, 1.0)],
    "top_k_top_p": [
        dict(temperature=0.7, top_k=8, top_p=0.9),
        dict(temperature=1.3, top_k=4),
        dict(temperature=0.5, top_p=0.8),
        dict(temperature=0.0),  # a greedy row inside a sampling batch
    ],
}


def sampling_info(rows: list[dict]) -> SamplingBatchInfo:
    """sglang's own ``SamplingBatchInfo.from_schedule_batch`` over real Reqs with these sampling parameters."""
    reqs = [make_req(f"r{i}", 8, stream=False, **row) for i, row in enumerate(rows)]
    return SamplingBatchInfo.from_schedule_batch(ScheduleBatch(reqs=reqs, device="cpu"), VOCAB)


def reference_entropy(
    logits: torch.Tensor, temperatures: torch.Tensor | None, mode: str, top_k: int | None
) -> torch.Tensor:
    """Independent float64 entropy: tempered = logits / T; top-k = the k largest (sorted), renormalised."""
    x = logits.double()
    if mode == "tempered":
        x = x / temperatures.double()
    if top_k:
        x = x.sort(dim=-1, descending=True).values[:, :top_k]
    p = torch.softmax(x, dim=-1)
    return -(p * p.log()).sum(-1)


def run_sampler(
    sampler: torch.nn.Module, logits: torch.Tensor, rows: list[dict], return_logprob: bool = True, seed: int = 1234
):
    """One real ``forward`` on a clone of ``logits`` under ``seed``; returns (ids, LogitsProcessorOutput)."""
    bs = logits.shape[0]
    out = LogitsProcessorOutput(next_token_logits=logits.clone())
    torch.manual_seed(seed)
    ids = sampler(out, sampling_info(rows), return_logprob, [0] * bs, [None] * bs, torch.arange(bs))
    return ids, out


def model_runner_sampler(real_scheduler, config: EntropyConfig) -> tuple[torch.nn.Module, type]:
    """Apply the patches with ``config``, build a real Scheduler; its ModelRunner's sampler and sglang's Sampler."""
    upstream = original_of(sampler_mod.Sampler)
    apply_scheduler_patches(config)
    scheduler = real_scheduler()
    return scheduler.tp_worker.model_runner.sampler, upstream


@pytest.fixture
def logits() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, VOCAB, generator=generator) * 2.5


@pytest.fixture
def formula_spy(monkeypatch) -> list[dict]:
    """Records each call of the entropy formula from the sampler: a copy of its inputs at call time and its result."""
    calls: list[dict] = []
    formula = sampler_patch.entropy_for_sampling

    def spy(logits, temperatures, config):
        call = dict(logits=logits.clone(), temperatures=temperatures.clone(), config=config)
        call["result"] = formula(logits, temperatures, config)
        calls.append(call)
        return call["result"]

    monkeypatch.setattr(sampler_patch, "entropy_for_sampling", spy)
    return calls


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_sampler_records_entropy_of_the_logits_before_forward_mutates_them(
    pristine, real_scheduler, formula_spy, logits, config_name, path
):
    config, rows = CONFIGS[config_name], PATHS[path]
    sampler, upstream = model_runner_sampler(real_scheduler, config)
    entropy_sampler_cls = sampler_mod.Sampler
    assert entropy_sampler_cls.__bases__ == (upstream,) and model_runner_mod.Sampler is entropy_sampler_cls
    assert type(sampler) is entropy_sampler_cls and entropy_sampler_cls.entropy_config == config

    ids, out = run_sampler(sampler, logits, rows)
    ref_ids, ref_out = run_sampler(upstream(), logits, rows)

    temperatures = sampling_info(rows).temperatures
    entropy = getattr(out, LOGITS_OUTPUT_ENTROPY_ATTR)
    assert entropy.dtype == torch.float32 and entropy.shape == (4,)
    # the formula ran once, on exactly the untouched logits and the batch's temperatures, and its result is attached
    (call,) = formula_spy
    assert torch.equal(call["logits"], logits) and torch.equal(call["temperatures"], temperatures)
    assert call["config"] == config and entropy is call["result"]
    expected = reference_entropy(logits, temperatures, config.mode, config.top_k)
    torch.testing.assert_close(entropy.double(), expected, rtol=0, atol=1e-5)

    # Sampling is untouched: same ids and logprobs as the unpatched Sampler under the same seed (which matters:
    # other seeds draw other ids on the sampling paths).
    assert ids.tolist() == ref_ids.tolist()
    other_seeds = {tuple(run_sampler(upstream(), logits, rows, seed=s)[0].tolist()) for s in range(5)}
    assert (other_seeds == {tuple(ids.tolist())}) == (path == "greedy")
    assert out.next_token_logprobs is not None
    torch.testing.assert_close(out.next_token_logprobs, ref_out.next_token_logprobs, rtol=0, atol=0)
    tempered_logprobs = torch.log_softmax(logits / temperatures, dim=-1)[torch.arange(4), ids.long()]
    torch.testing.assert_close(out.next_token_logprobs, tempered_logprobs, rtol=0, atol=1e-5)

    mutated = out.next_token_logits
    if path == "greedy":
        assert torch.equal(mutated, logits)  # argmax path leaves the logits alone
    else:
        # forward turned the logits into probabilities in place: entropy computed afterwards would be wrong
        assert not torch.equal(mutated, logits)
        torch.testing.assert_close(mutated.sum(-1), torch.ones(4))
        after = reference_entropy(mutated, None, "raw", config.top_k)
        assert not torch.allclose(after, expected, atol=1e-3)


def test_tempered_and_raw_entropy_differ_at_temperature_not_one(pristine, real_scheduler, logits):
    rows = PATHS["temperature"]
    sampler, _ = model_runner_sampler(real_scheduler, CONFIGS["raw"])
    values = {}
    for name in ("raw", "tempered"):
        apply_scheduler_patches(CONFIGS[name])  # a later call changes the configuration the sampler reads
        values[name] = getattr(run_sampler(sampler, logits, rows)[1], LOGITS_OUTPUT_ENTROPY_ATTR)
    # rows 0-2 have T != 1 (tempering changes the distribution), row 3 has T == 1
    assert (values["raw"][:3] - values["tempered"][:3]).abs().min() > 0.05
    torch.testing.assert_close(values["raw"][3], values["tempered"][3])
    temperatures = sampling_info(rows).temperatures
    for name in ("raw", "tempered"):
        expected = reference_entropy(logits, temperatures, name, None)
        torch.testing.assert_close(values[name].double(), expected, rtol=0, atol=1e-5)


def test_sampler_computes_no_entropy_without_logprobs(pristine, real_scheduler, logits, monkeypatch):
    sampler, upstream = model_runner_sampler(real_scheduler, EntropyConfig())

    def must_not_run(*args, **kwargs):
        raise AssertionError("entropy computed for a batch without return_logprob")

    monkeypatch.setattr(sampler_patch, "entropy_for_sampling", must_not_run)
    rows = PATHS["top_k_top_p"]
    ids, out = run_sampler(sampler, logits, rows, return_logprob=False)
    ref_ids, _ = run_sampler(upstream(), logits, rows, return_logprob=False)
    assert getattr(out, LOGITS_OUTPUT_ENTROPY_ATTR, None) is None and out.next_token_logprobs is None
    assert ids.tolist() == ref_ids.tolist()
