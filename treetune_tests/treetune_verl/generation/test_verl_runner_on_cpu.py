# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``backend=verl`` without Ray: the verl config the job composes, and rollout rows read back as Engine outputs.

The composed config is the installed verl's real ``ppo_trainer`` (Hydra; verl 0.7.1 or 0.9.1) and is checked by our own start-up refusals
(``check_rollout_config``); the rows are a real ``DataProto`` laid out as verl's agent-loop worker lays it out (left-
padded prompts, right-padded responses). The whole path on real Ray and a real Engine:
``test_generation_verl_backend_on_cpu.py``.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from verl.protocol import DataProto

from treetune_verl.batch_keys import HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.generation.config import resolve_config
from treetune_verl.generation.verl_runner import compose_verl_config, engine_shaped_outputs
from treetune_verl.rollout.rollout_config import check_rollout_config

EOS = 2


class _Decoder:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i == EOS))


def _rollout(responses: list[list[int]], response_length: int, has_entropy: list[bool]) -> DataProto:
    """Prompts of 2 tokens (left-padded to 3), responses right-padded to ``response_length``; entropy of token j of
    row i = 0.1 * (i + 1) + 0.01 * j, log-prob = -entropy."""
    b = len(responses)
    prompts = torch.tensor([[0, 7, 8]] * b)
    resp = torch.zeros(b, response_length, dtype=torch.long)
    entropy = torch.zeros(b, response_length)
    attention = torch.zeros(b, 3 + response_length, dtype=torch.long)
    attention[:, 1:3] = 1
    for i, ids in enumerate(responses):
        resp[i, : len(ids)] = torch.tensor(ids)
        entropy[i, : len(ids)] = torch.tensor([0.1 * (i + 1) + 0.01 * j for j in range(len(ids))])
        attention[i, 3 : 3 + len(ids)] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": resp,
            "attention_mask": attention,
            "rollout_log_probs": -entropy,
            ROLLOUT_ENTROPY_KEY: entropy,
            HAS_ROLLOUT_ENTROPY_KEY: torch.tensor(has_entropy),
        }
    )


def test_rows_read_back_as_engine_outputs_with_finish_reasons():
    batch = _rollout([[5, 6, 9, 4], [5, EOS], [5, 6, 9, EOS]], response_length=4, has_entropy=[True] * 3)
    outputs = engine_shaped_outputs(batch, max_new_tokens=4, eos_token_ids={EOS}, tokenizer=_Decoder())
    assert [o["meta_info"]["finish_reason"]["type"] for o in outputs] == ["length", "stop", "stop"]
    second = outputs[1]
    assert second["text"] == "5"
    assert [t for _, t, _ in second["meta_info"]["output_token_logprobs"]] == [5, EOS]
    assert second["meta_info"]["output_token_entropy"] == pytest.approx([0.2, 0.21])
    assert [lp for lp, _, _ in second["meta_info"]["output_token_logprobs"]] == pytest.approx([-0.2, -0.21])


def test_a_row_without_entropy_is_refused_not_written_as_zeros():
    batch = _rollout([[5, 6], [5, 6]], response_length=4, has_entropy=[True, False])
    with pytest.raises(RuntimeError, match="rollout row 1 carries no entropy"):
        engine_shaped_outputs(batch, max_new_tokens=4, eos_token_ids={EOS}, tokenizer=_Decoder())


def test_composed_verl_config_carries_the_job_settings(tiny_model_dir):
    cfg = resolve_config(
        {
            "backend": "verl",
            "model": {"device": "cpu"},
            "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 48, "seed": 3},
            "entropy": {"top_k": 5, "mode": "tempered"},
            "verl": {"num_workers": 3, "overrides": ["actor_rollout_ref.rollout.agent.num_workers=4"]},
        }
    )
    config = compose_verl_config(cfg, str(tiny_model_dir), prompt_length=37)
    rollout = config.actor_rollout_ref.rollout
    check_rollout_config(rollout)  # our start-up refusals accept it
    assert (rollout.temperature, rollout.top_p, rollout.top_k, rollout.n) == (0.7, 0.9, 20, 1)
    assert (rollout.prompt_length, rollout.response_length) == (37, 48)
    assert (rollout.custom.entropy.top_k, rollout.custom.entropy.mode) == (5, "tempered")
    assert rollout.agent.agent_loop_manager_class == "treetune_verl.verl.EntropyAgentLoopManager"
    assert rollout.agent.num_workers == 4  # verl.overrides come last
    sglang = rollout.engine_kwargs.sglang
    assert sglang.device == "cpu" and sglang.attention_backend == "torch_native" and not sglang.enable_memory_saver
    assert sglang.random_seed == 3 and "model_path" not in sglang
    # verl 0.9.1's standalone server serves rollout.load_format as given (dummy: random weights) unless told; verl
    # 0.7.1's loads the real weights in standalone mode itself (its default stays)
    expected_format = "auto" if importlib.metadata.version("verl") == "0.9.1" else "dummy"
    assert rollout.load_format == expected_format
