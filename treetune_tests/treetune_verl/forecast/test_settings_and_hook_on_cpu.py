# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The forecast's config (the Hydra block composed with verl 0.7.1's ``ppo_trainer``, refusals naming the key), its
actor seams (guards, idempotence, every-k schedule, the forecast at the first optimizer step inside the loss fix's
step counter), E's prompts from a ``DataProto``, and the PNG plot."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import verl
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos, rollout_corr_helper
from verl.workers.actor import dp_actor
from verl.workers.fsdp_workers import ActorRolloutRefWorker

from treetune_verl.forecast import live
from treetune_verl.forecast.settings import SECTION, ForecastSettings, forecast_settings
from treetune_verl.forecast.verl_batch import eval_prompts, prompts_by_uid
from treetune_verl.patching import is_patched, original_of
from treetune_verl.verl.v0_7_1 import actor_seams
from treetune_verl.verl_guard import UnsupportedVerlError

BLOCK = ["hydra.searchpath=[pkg://treetune_verl.config]", "+treetune_forecast=entropy_forecast"]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def test_block_composes_alone_and_after_the_rollout_entropy_block():
    alone = _compose(BLOCK).actor_rollout_ref
    assert alone.model.external_lib == "treetune_verl.verl.process_setup"  # the one actor entry point
    assert forecast_settings(alone.rollout) == ForecastSettings()
    both = _compose(
        [BLOCK[0], "+treetune=rollout_entropy", BLOCK[1], "actor_rollout_ref.rollout.custom.entropy_forecast.every=3"]
    ).actor_rollout_ref.rollout
    assert "entropy" in both.custom and forecast_settings(both).every == 3
    assert forecast_settings(_compose([]).actor_rollout_ref.rollout) is None  # off without the block


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"every": 0}, "every"),
        ({"every": True}, "every"),
        ({"estimators": ["naive", "exact"]}, "estimators"),
        ({"estimators": []}, "estimators"),
        ({"top_p": 0.9}, "top_p"),  # E is sampled at top-p = 1 (the forecast differentiates the policy)
        ({"seed": -1}, "seed"),
        ({"eval_share": 0}, "eval_share"),
        ({"eval_share": 1.5}, "eval_share"),
        ({"eval_share": True}, "eval_share"),
        ({"method": "forward"}, "method"),
        ({"probe": {"probe": {"buffers_dtype": "int8"}}}, "probe"),
        ({"probe": {"no_such": 1}}, "probe"),
        ({"record_dir": ""}, "record_dir"),
        ({"record_dir": 3}, "record_dir"),
        ({"evry": 2}, r"evry: unknown key; did you mean 'every'"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(section, key):
    with pytest.raises(ValueError, match=f"{SECTION}.*{key}"):
        forecast_settings({"custom": {"entropy_forecast": section}})


def test_eval_share_takes_the_first_uids_in_sorted_order():
    uids = [f"u{k}" for k in (3, 0, 9, 1, 4, 2, 8, 5, 7, 6)] * 2  # rows: each uid twice, in no order
    assert forecast_settings({"custom": {"entropy_forecast": {}}}).eval_uids(uids) == [f"u{k}" for k in range(5)]
    assert ForecastSettings(eval_share=0.3).eval_uids(uids) == ["u0", "u1", "u2"]  # 0.3 * 10 is 3, not 4
    assert ForecastSettings(eval_share=1.0).eval_uids(uids) == sorted(set(uids))
    assert ForecastSettings(eval_share=0.01).eval_uids(uids) == ["u0"]  # at least one


def test_probe_settings_reach_the_probe_config():
    settings = forecast_settings(
        OmegaConf.create(
            {
                "custom": {
                    "entropy_forecast": {
                        "probe": {"estimator": {"baseline": {"mode": "loo"}}, "generation": {"top_p": 0.9}}
                    }
                }
            }
        )
    )
    config = settings.probe_config("naive", 0.7)
    assert config.generation.temperature == 0.7 and config.generation.top_p == 1.0  # the actor's policy wins
    assert config.estimator.x_estimator_mode == "naive" and config.estimator.baseline.mode == "loo"
    # the forecast's default RB baseline is b_j = H_j (none), kept under a probe setting that names other keys
    assert ForecastSettings().probe_config("rb_residual", 1.0).estimator.baseline.mode == "none"
    other = ForecastSettings(probe={"probe": {"buffers_dtype": "float64"}}).probe_config("rb_residual", 1.0)
    assert other.estimator.baseline.mode == "none" and other.probe.buffers_dtype == "float64"


SEAMS = [
    (ActorRolloutRefWorker, "update_actor"),
    (dp_actor.DataParallelPPOActor, "update_policy"),
    (core_algos, "agg_loss"),
    (dp_actor, "agg_loss"),
    (rollout_corr_helper, "compute_rollout_corr_metrics_from_logprobs"),
]


@pytest.fixture
def upstream(monkeypatch):
    for owner, name in SEAMS:
        monkeypatch.setattr(owner, name, original_of(getattr(owner, name)))  # restored after the test


def test_install_is_idempotent_and_keeps_verls_dispatch_attributes(upstream):
    from verl.single_controller.base.decorator import MAGIC_ATTR

    actor_seams.install()
    first = ActorRolloutRefWorker.update_actor
    actor_seams.install()
    assert ActorRolloutRefWorker.update_actor is first and all(is_patched(owner, name) for owner, name in SEAMS)
    assert getattr(first, MAGIC_ATTR) == getattr(original_of(first), MAGIC_ATTR)


def test_install_refuses_another_verl_or_a_changed_signature(upstream, monkeypatch):
    monkeypatch.setattr(verl, "__version__", "0.8.0")
    with pytest.raises(UnsupportedVerlError, match="0.7.1"):
        actor_seams.install()
    monkeypatch.setattr(verl, "__version__", "0.7.1")

    def update_actor(self, data, epoch=0):
        raise AssertionError("never called")

    monkeypatch.setattr(ActorRolloutRefWorker, "update_actor", update_actor)
    with pytest.raises(UnsupportedVerlError, match="update_actor"):
        actor_seams.install()
    assert not any(is_patched(owner, name) for owner, name in SEAMS)


def test_update_actor_asks_every_kth_update_for_a_forecast_and_passes_the_others_through():
    requests = []

    class Actor:
        def update_policy(self, data):
            requests.append(vars(self).get(actor_seams._FORECAST_REQUEST_ATTR))
            return {"actor/pg_loss": 1.0}

    def verl_update_actor(self, data):  # stands in for verl's: calls the actor's update_policy on the instance
        return self.actor.update_policy(data)

    worker = SimpleNamespace(
        actor=Actor(),
        config=OmegaConf.create({"rollout": {"n": 2, "custom": {"entropy_forecast": {"every": 2}}}}),
        tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=7),
        generation_config=SimpleNamespace(eos_token_id=[5, 6]),
    )
    hooked = actor_seams._wrap_update_actor(verl_update_actor)
    outputs = [hooked(worker, SimpleNamespace(meta_info={})) for _ in range(5)]
    assert outputs == [{"actor/pg_loss": 1.0}] * 5
    asked = [r for r in requests if r is not None]
    assert [i + 1 for i, r in enumerate(requests) if r is not None] == [1, 3, 5]  # calls 1, 1 + k, 1 + 2k
    settings, state, rollout_n, eos_token_ids = asked[0]
    assert settings.every == 2 and rollout_n == 2 and eos_token_ids == [5, 6] and state.calls == 5
    assert actor_seams._FORECAST_REQUEST_ATTR not in vars(worker.actor)  # the per-call request is gone
    worker.config = OmegaConf.create({"rollout": {"n": 2, "custom": None}})
    requests.clear()
    assert hooked(worker, SimpleNamespace(meta_info={})) == {"actor/pg_loss": 1.0} and requests == [None]


def test_update_policy_runs_the_forecast_inside_the_loss_fixs_step_counter(monkeypatch):
    """With aborted rows and a forecast: ``_optimizer_step`` goes counter -> forecast -> verl, and the forecast's
    metrics join verl's; both are gone after the call."""
    calls = []

    class Run:
        @classmethod
        def from_dp_actor(cls, actor, data, settings, state, rollout_n, eos_token_ids):
            calls.append("sample E")
            return cls()

        def optimizer_step(self, verl_step):
            calls.append("forecast")
            return verl_step()

        def finish(self):
            return {"probe/deltaH1/naive": 0.5}

    normalisation = SimpleNamespace(optimizer_step=lambda step: (calls.append("counter"), step())[1])
    monkeypatch.setattr(actor_seams, "ForecastRun", Run)
    monkeypatch.setattr(actor_seams, "normalisation_for", lambda actor, data: normalisation)

    class Actor:
        def _optimizer_step(self):
            calls.append("verl")
            return 1.5

    def verl_update_policy(self, data):  # stands in for verl's: one optimizer step per mini-batch
        assert actor_seams._ACTIVE_NORMALISATION is normalisation
        return {"actor/grad_norm": [self._optimizer_step(), self._optimizer_step()]}

    actor = Actor()
    actor._treetune_forecast_request = ("settings", "state", 2, [0])
    metrics = actor_seams._wrap_update_policy(verl_update_policy)(actor, None)
    assert metrics == {"actor/grad_norm": [1.5, 1.5], "probe/deltaH1/naive": 0.5}
    assert calls == ["sample E", "counter", "forecast", "verl", "counter", "forecast", "verl"]
    assert "_optimizer_step" not in vars(actor) and actor_seams._ACTIVE_NORMALISATION is None


def _rows(uids: list[str], prompts: list[list[int]]) -> DataProto:
    R = 2
    P = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) : P] = torch.tensor(p)
        mask[i, P - len(p) :] = 1
        ids[i, P:] = 9
    batch = {"input_ids": ids, "attention_mask": mask, "responses": ids[:, P:], "response_mask": mask[:, P:]}
    return DataProto.from_dict(batch, non_tensors={"uid": np.array(uids, dtype=object)})


def test_eval_prompts_are_the_distinct_prompts_without_padding():
    data = _rows(["b", "a", "b", "a"], [[4, 5], [3], [4, 5], [3]])
    assert prompts_by_uid(data) == {"b": [4, 5], "a": [3]}
    prompts = eval_prompts(prompts_by_uid(data), ForecastSettings(eval_share=1.0).eval_uids)
    assert prompts.prompt_ids == [[3], [4, 5]] and prompts.total == 2 and prompts.left_out == 0
    half = eval_prompts(prompts_by_uid(data), ForecastSettings(eval_share=0.5).eval_uids)  # E's share: uid "a"
    assert half.prompt_ids == [[3]] and half.total == 1
    data.non_tensor_batch.pop("uid")
    with pytest.raises(ValueError, match="uid"):
        prompts_by_uid(data)


def test_fsdp1_is_refused():
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = FullyShardedDataParallel.__new__(FullyShardedDataParallel)
    with pytest.raises(NotImplementedError, match="strategy=fsdp2"):
        live._check_model(model)


@pytest.mark.parametrize(
    ("config", "rows", "prompts"),
    [
        ({"ppo_micro_batch_size_per_gpu": 8}, 8, 4),  # 8 rows, G = 2
        ({"ppo_micro_batch_size_per_gpu": 1}, 1, 1),  # at least one prompt
        ({"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 1024}, 8, 4),  # dynamic: 1024 // 128 rows
    ],
)
def test_e_forwards_use_verls_micro_batch(config, rows, prompts):
    from verl.workers.config import FSDPActorConfig

    actor_config = FSDPActorConfig(
        strategy="fsdp2", ppo_mini_batch_size=8, rollout_n=2, use_torch_compile=False, **config
    )
    rows_of = (actor_config.ppo_micro_batch_size_per_gpu, actor_config.ppo_max_token_len_per_gpu)
    assert live.rows_per_forward(*rows_of, width=128) == rows
    assert live.prompts_per_forward(rows, G=2) == prompts
