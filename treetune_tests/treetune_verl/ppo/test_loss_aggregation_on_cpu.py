# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Aborted rows in verl 0.7.1's legacy actor loss: the gradients of each mini-batch are its completed rows' loss.

Real: verl's ``DataParallelPPOActor.update_policy`` (its split into mini- and micro-batches, forward, policy loss,
``loss_scale_factor``, backward, ``_optimizer_step``), ``agg_loss``, ``FSDPActorConfig``, around a tiny random Qwen2
on CPU: a plain module for one rank, ``DistributedDataParallel`` over two gloo ranks for the data-parallel sums
(FSDP averages gradients over ranks the same way). The gradients are captured at ``_optimizer_step`` (SGD with
lr 0, so every mini-batch sees the same weights) and compared with the test's own forward, PPO loss at ratio 1
and aggregation over the completed rows.
"""

from __future__ import annotations

import datetime
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import verl
from verl import DataProto
from verl.trainer.ppo import core_algos, rollout_corr_helper
from verl.utils.seqlen_balancing import prepare_dynamic_batch
from verl.workers.actor import dp_actor
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import FSDPActorConfig, FSDPEngineConfig
from verl.workers.fsdp_workers import ActorRolloutRefWorker

from treetune_tests.tiny_model import tiny_causal_lm
from treetune_verl.batch_keys import ROLLOUT_ABORTED_KEY as ABORTED_KEY
from treetune_verl.patching import is_patched, original_of
from treetune_verl.verl.v0_7_1 import actor_seams
from treetune_verl.verl.v0_7_1.actor_seams import install
from treetune_verl.verl_guard import UnsupportedVerlError

PROMPT, RESPONSE, VOCAB = 3, 4, 32
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
PATCHED = [
    (core_algos, "agg_loss"),
    (dp_actor, "agg_loss"),
    (DataParallelPPOActor, "update_policy"),
    (rollout_corr_helper, "compute_rollout_corr_metrics_from_logprobs"),
    (ActorRolloutRefWorker, "update_actor"),
]

Grads = dict[str, torch.Tensor]


@pytest.fixture
def upstream(monkeypatch):
    """verl as shipped for the test (whatever an earlier import installed is put back afterwards)."""
    for owner, name in PATCHED:
        monkeypatch.setattr(owner, name, original_of(getattr(owner, name)))
    if not (dist.is_available() and dist.is_initialized()):
        monkeypatch.setattr(dist, "get_rank", lambda *args, **kwargs: 0)  # dp_actor prints the rank


@pytest.fixture
def patched(upstream):
    install()


def _model() -> torch.nn.Module:
    return tiny_causal_lm("qwen2", VOCAB, 16, lm_head_std=0.5, pad_token_id=0, bos_token_id=None, eos_token_id=1)


def _data(lengths: list[int], seed: int = 0, aborted_key: bool = True) -> DataProto:
    """Prompt of 3 tokens, response of ``length`` tokens right-padded to 4; length 0 is an aborted row."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(lengths)
    input_ids = torch.randint(2, VOCAB, (rows, PROMPT + RESPONSE), generator=gen)
    response_mask = (torch.arange(RESPONSE)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)
    attention_mask = torch.cat([torch.ones(rows, PROMPT, dtype=torch.int64), response_mask], dim=1)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, PROMPT:],
        "response_mask": response_mask,
        "advantages": torch.randn(rows, RESPONSE, generator=gen) * response_mask,
        "old_log_probs": torch.zeros(rows, RESPONSE),
    }
    if aborted_key:
        tensors[ABORTED_KEY] = torch.tensor(lengths) == 0
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0, "pad_token_id": 0})


def _log_probs(model: torch.nn.Module, data: DataProto) -> torch.Tensor:
    """The test's own forward: [rows, RESPONSE] log-probs of the response tokens."""
    batch = data.batch
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    logp = torch.log_softmax(logits[:, PROMPT - 1 : -1].float(), dim=-1)
    return logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def _with_current_log_probs(model: torch.nn.Module, data: DataProto) -> DataProto:
    """``old_log_probs`` := the current policy's, so every mini-batch (at lr 0) is at ratio 1."""
    with torch.no_grad():
        data.batch["old_log_probs"] = _log_probs(model, data)
    return data


def _target_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The mini-batch loss over completed rows (C of them, T tokens): what the patch must give."""
    completed = mask.sum(-1) > 0
    if not completed.any():
        return (loss_mat * 0).sum()
    seq_sum = (loss_mat * mask).sum(-1)[completed]
    if mode == "token-mean":
        return seq_sum.sum() / mask.sum()
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / completed.sum()
    if mode == "seq-mean-token-mean":
        return (seq_sum / mask.sum(-1)[completed]).sum() / completed.sum()
    return seq_sum.sum() / completed.sum() / mask.shape[-1]  # seq-mean-token-sum-norm: horizon = response length


def _reference_grads(model: torch.nn.Module, mini_batches: list[DataProto], mode: str) -> list[Grads]:
    grads = []
    for mini_batch in mini_batches:
        model.zero_grad()
        logp = _log_probs(model, mini_batch)
        loss_mat = -mini_batch.batch["advantages"] * torch.exp(logp - logp.detach())  # vanilla PPO at ratio 1
        _target_loss(loss_mat, mini_batch.batch["response_mask"].float(), mode).backward()
        grads.append({name: param.grad.clone() for name, param in model.named_parameters()})
    model.zero_grad()
    return grads


def _config(mode: str, mini: int, micro: int = 2, dynamic: bool = False, epochs: int = 1) -> FSDPActorConfig:
    return FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=None if dynamic else micro,
        use_dynamic_bsz=dynamic,
        ppo_max_token_len_per_gpu=14,  # dynamic: two 7-token rows per micro-batch at most
        loss_agg_mode=mode,
        entropy_coeff=0.0,
        use_kl_loss=False,
        ppo_epochs=epochs,
        rollout_n=1,
        use_torch_compile=False,
        use_remove_padding=False,
        grad_clip=1e9,  # clipping would rescale the gradients we compare (they are captured before, anyway)
        fsdp_config=FSDPEngineConfig(dtype="float32"),
    )


def _run_actor(model: torch.nn.Module, data: DataProto, config: FSDPActorConfig) -> tuple[list[Grads], dict]:
    """verl's ``update_policy``; the gradients of each mini-batch as ``_optimizer_step`` finds them."""
    actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=0.0))
    captured: list[Grads] = []
    step = actor._optimizer_step

    def capture():
        captured.append({name.removeprefix("module."): p.grad.clone() for name, p in model.named_parameters()})
        return step()

    actor._optimizer_step = capture
    metrics = actor.update_policy(data)
    assert vars(actor)["_optimizer_step"] is capture  # the patch put the instance's own attribute back
    return captured, metrics


def _assert_grads_close(actual: list[Grads], expected: list[Grads]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


# name: (response lengths, mini-batch size); micro-batches of 2 rows (dynamic: by tokens)
LAYOUTS = {
    "an all-aborted micro-batch": ([4, 2, 0, 0], 4),
    "micro-batches with 1 and 2 completed rows": ([4, 0, 3, 2], 4),
    "two mini-batches": ([4, 0, 0, 0, 2, 3, 0, 1], 4),
    "an all-aborted mini-batch": ([0, 0, 0, 0, 2, 3, 0, 1], 4),
}


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed-micro", "dynamic-bsz"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", MODES)
def test_patched_gradients_are_the_completed_rows_loss(patched, mode, layout, dynamic):
    lengths, mini = LAYOUTS[layout]
    model = _model()
    data = _with_current_log_probs(model, _data(lengths))
    if dynamic:
        assert max(len(prepare_dynamic_batch(mb, max_token_len=14)[0]) for mb in data.split(mini)) >= 2
    expected = _reference_grads(model, data.split(mini), mode)
    captured, metrics = _run_actor(model, data, _config(mode, mini, dynamic=dynamic))
    _assert_grads_close(captured, expected)
    assert all(torch.isfinite(torch.tensor(value)).all() for value in metrics.values())
    if layout == "an all-aborted mini-batch":  # loss 0, zero gradients, and the optimizer step still happens
        assert all(torch.count_nonzero(grad) == 0 for grad in captured[0].values())


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_mini_batch_counts_repeat_for_each_ppo_epoch(patched, mode):
    lengths, mini = LAYOUTS["two mini-batches"]
    model = _model()
    data = _with_current_log_probs(model, _data(lengths))
    expected = _reference_grads(model, data.split(mini), mode)
    captured, _ = _run_actor(model, data, _config(mode, mini, epochs=2))
    _assert_grads_close(captured, expected + expected)  # lr 0: the second epoch sees the same weights


@pytest.mark.parametrize("mode", MODES)
def test_unpatched_verl_halves_the_gradient_and_reports_nan_for_an_all_aborted_micro_batch(upstream, mode):
    """verl's 0 / 0 is NaN in the loss (and the ``actor/pg_loss`` metric), but ``masked_sum``'s ``torch.where``
    (``verl/utils/torch_functional.py`` ``masked_sum``) keeps it out of the gradients: the empty micro-batch just
    takes half of the mini-batch's weight."""
    model = _model()
    data = _with_current_log_probs(model, _data(LAYOUTS["an all-aborted micro-batch"][0]))
    expected = _reference_grads(model, data.split(4), mode)
    captured, metrics = _run_actor(model, data, _config(mode, 4))
    assert torch.isnan(torch.tensor(metrics["actor/pg_loss"]))
    assert torch.isfinite(torch.tensor(metrics["actor/grad_norm"])).all()  # so the step is taken
    _assert_grads_close(captured, [{name: grad / 2 for name, grad in grads.items()} for grads in expected])


@pytest.mark.parametrize("mode", MODES)
def test_unpatched_verl_weighs_micro_batches_not_completed_rows(upstream, mode):
    model = _model()
    data = _with_current_log_probs(model, _data(LAYOUTS["micro-batches with 1 and 2 completed rows"][0]))
    expected = _reference_grads(model, data.split(4), mode)
    captured, _ = _run_actor(model, data, _config(mode, 4))
    assert all(torch.isfinite(grad).all() for grad in captured[0].values())
    with pytest.raises(AssertionError):
        _assert_grads_close(captured, expected)


@pytest.mark.parametrize("aborted_key", [False, True], ids=["no-key", "all-false"])
@pytest.mark.parametrize("mode", MODES)
def test_without_aborted_rows_verl_is_unchanged(upstream, monkeypatch, mode, aborted_key):
    def run() -> tuple[list[Grads], dict]:
        model = _model()
        data = _with_current_log_probs(model, _data([4, 1, 3, 2, 2, 4], aborted_key=aborted_key))
        return _run_actor(model, data, _config(mode, 4))  # mini-batches of 4 and 2 rows

    verl_grads, verl_metrics = run()
    install()
    ours, our_metrics = run()
    assert our_metrics == verl_metrics
    for got, want in zip(ours, verl_grads, strict=True):
        assert all(torch.equal(got[name], want[name]) for name in want)


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_outside_update_policy_is_verls_but_never_nan(patched, mode):
    loss_mat = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    verl_agg = original_of(core_algos.agg_loss)
    assert torch.equal(core_algos.agg_loss(loss_mat, mask, mode), verl_agg(loss_mat, mask, mode))
    assert torch.isnan(verl_agg(loss_mat, torch.zeros_like(mask), mode))
    for agg_loss in (core_algos.agg_loss, dp_actor.agg_loss):
        loss = agg_loss(loss_mat=loss_mat, loss_mask=torch.zeros_like(mask), loss_agg_mode=mode)
        loss.backward()
        assert loss.item() == 0.0 and torch.count_nonzero(loss_mat.grad) == 0


def test_install_is_idempotent(upstream):
    install()
    first = [getattr(owner, name) for owner, name in PATCHED]
    install()
    assert [getattr(owner, name) for owner, name in PATCHED] == first
    assert all(is_patched(owner, name) for owner, name in PATCHED)
    assert inspect.signature(original_of(core_algos.agg_loss)).parameters.keys() == set(actor_seams.AGG_LOSS_PARAMS)


def test_install_refuses_a_changed_signature(upstream, monkeypatch):
    def agg_loss(loss_mat, loss_mask, loss_agg_mode="token-mean", dp_size=1, global_batch_info=None):
        raise AssertionError("never called")

    monkeypatch.setattr(core_algos, "agg_loss", agg_loss)
    with pytest.raises(UnsupportedVerlError, match="core_algos.agg_loss"):
        install()
    monkeypatch.setattr(core_algos, "agg_loss", original_of(dp_actor.agg_loss))

    def update_policy(self, data, epoch=0):
        raise AssertionError("never called")

    monkeypatch.setattr(DataParallelPPOActor, "update_policy", update_policy)
    with pytest.raises(UnsupportedVerlError, match="update_policy"):
        install()
    assert not any(is_patched(owner, name) for owner, name in PATCHED)  # all or none


def test_install_refuses_another_verl_version(upstream, monkeypatch):
    monkeypatch.setattr(verl, "__version__", "0.8.0")
    with pytest.raises(UnsupportedVerlError, match="0.7.1"):
        install()
    assert not any(is_patched(owner, name) for owner, name in PATCHED)


def test_optimizer_step_and_context_are_restored_after_an_exception(patched, monkeypatch):
    model = _model()
    data = _data([4, 0, 3, 2])
    actor = DataParallelPPOActor(_config("token-mean", 4), model, torch.optim.SGD(model.parameters(), lr=0.0))

    def boom():
        raise RuntimeError("boom at the optimizer step")

    actor._optimizer_step = boom
    with pytest.raises(RuntimeError, match="boom"):
        actor.update_policy(data)
    assert vars(actor)["_optimizer_step"] is boom and actor_seams._ACTIVE_NORMALISATION is None

    del actor._optimizer_step
    monkeypatch.setattr(model, "forward", lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        actor.update_policy(data)
    assert "_optimizer_step" not in vars(actor) and actor_seams._ACTIVE_NORMALISATION is None


def test_ulysses_sequence_parallel_is_refused(patched):
    model = _model()
    actor = DataParallelPPOActor(_config("token-mean", 4), model, torch.optim.SGD(model.parameters(), lr=0.0))
    actor.ulysses_sequence_parallel_size = 2
    with pytest.raises(NotImplementedError, match="ulysses_sequence_parallel_size"):
        actor.update_policy(_data([4, 0, 3, 2]))


ACTOR_SETUP_SCRIPT = """
import importlib, sys
from verl.trainer.ppo import core_algos, rollout_corr_helper
from verl.workers.actor import dp_actor
from verl.workers.fsdp_workers import ActorRolloutRefWorker
from treetune_verl.patching import is_patched

importlib.import_module(sys.argv[1])
assert is_patched(core_algos, "agg_loss") and is_patched(dp_actor, "agg_loss")
assert is_patched(dp_actor.DataParallelPPOActor, "update_policy")
assert is_patched(rollout_corr_helper, "compute_rollout_corr_metrics_from_logprobs")
assert is_patched(ActorRolloutRefWorker, "update_actor")
assert {"grpo_valid", "rloo_valid"} <= set(core_algos.ADV_ESTIMATOR_REGISTRY)
import verl.workers.engine_workers  # what a worker of trainer.use_legacy_worker_impl=disable has imported
try:
    importlib.reload(importlib.import_module("treetune_verl.verl.process_setup"))
except RuntimeError as error:
    print(error)
"""


def test_process_setup_installs_in_a_legacy_worker_and_refuses_the_new_one():
    command = [sys.executable, "-c", ACTOR_SETUP_SCRIPT, "treetune_verl.verl.process_setup"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trainer.use_legacy_worker_impl=auto" in result.stdout


# Two data-parallel ranks: each holds its own 4 rows (one mini-batch of 4 per rank, micro-batches of 2), so the
# global mini-batch is 8 rows; rank 1 holds an all-aborted micro-batch, rank 0 no aborted row at all (it must still
# join the all-reduce of the counts, or rank 1 waits forever).
RANK_LENGTHS = [[4, 2, 3, 1], [0, 0, 2, 0]]


DDP_MODES = ["token-mean", "seq-mean-token-mean"]


def _ddp_rank(rank: int, store: str, out_dir: str) -> None:
    timeout = datetime.timedelta(seconds=60)  # a missed collective fails the test instead of hanging it
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timeout)
    try:
        install()
        for mode in DDP_MODES:
            wrapped = torch.nn.parallel.DistributedDataParallel(_model())
            captured, _ = _run_actor(wrapped, _data(RANK_LENGTHS[rank], seed=rank), _config(mode, 4))
            torch.save(captured, Path(out_dir) / f"{mode}-rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_data_parallel_ranks_normalise_over_the_global_mini_batch(tmp_path):
    torch.multiprocessing.spawn(_ddp_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    global_mini_batch = DataProto.concat([_data(lengths, seed=rank) for rank, lengths in enumerate(RANK_LENGTHS)])
    for mode in DDP_MODES:
        expected = _reference_grads(_model(), [global_mini_batch], mode)
        for rank in range(2):
            _assert_grads_close(torch.load(tmp_path / f"{mode}-rank{rank}.pt"), expected)
