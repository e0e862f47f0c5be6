# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``EntropySGLangHttpServer`` (verl 0.7.1 + sglang 0.5.6.post2) on CPU, as far as verl's server runs without a GPU.

Runs for real: the server object built by verl's own ``__init__`` from the Hydra-composed config; verl's whole
``launch_server`` (``ServerArgs`` from the rollout config, ``_set_envs_and_config``, ``_launch_subprocesses`` with
our scheduler injected, the global HTTP state and the uvicorn HTTP server), with the CPU engine arguments passed
through ``rollout.engine_kwargs.sglang`` (verl spreads them last); verl's ``generate`` on a real sglang CPU Engine;
``EntropyAgentLoopWorker.generate_sequences`` with the real single-turn and tool (interaction) loops. Checked:
``rollout_entropy`` equals an independent teacher-forced HF recomputation at every ``response_mask`` position
within 1e-4 nats, and is 0.0 elsewhere.

Not run here (needs a GPU): ``EntropySGLangReplica.launch_servers`` (``init_hybrid``/``init_standalone`` place the
server actor on GPU bundles and read ``CUDA_VISIBLE_DEVICES`` from GPU workers) and the weight sync from the
trainer (``ServerAdapter``, CUDA IPC). Between the worker and the server, a local call stands in for Ray
(``AsyncLLMServerManager`` does ``server.generate.remote(...)``); the Ray hop itself is covered with a fake server in
``treetune_tests/treetune_verl/agent_loop/test_entropy_ray_on_cpu.py``.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest
import torch

from treetune_tests.treetune_verl.agent_loop.fakes import make_batch, tool_overrides, unpadded
from treetune_tests.treetune_verl.rollout.server_helpers import make_server, server_config, stop_server
from treetune_tests.treetune_verl.sglang.engine_helpers import hf_token_entropy

pytest.importorskip("uvicorn", reason="sglang's http_server (imported by verl's server) needs uvicorn")
pytest.importorskip("multipart", reason="sglang's http_server needs python-multipart")

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 128
TURN_TOKENS = 24  # per model turn, so that the tool loop reaches its interaction turns on a random model


def _config(model_path, workdir, **rollout: Any):
    return server_config(model_path, PROMPT_LENGTH, RESPONSE_LENGTH, overrides=tool_overrides(workdir), **rollout)


_server = make_server


class LocalServerManager:
    """verl's ``AsyncLLMServerManager.generate`` without Ray: a new request id per turn, a copy of the sampling
    parameters (Ray serialises them; the server pops keys), and a per-turn cap on new tokens."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None):
        return await self.server.generate(
            prompt_ids=prompt_ids,
            sampling_params={**sampling_params, "max_new_tokens": TURN_TOKENS},
            request_id=uuid4().hex,
            image_data=image_data,
            video_data=video_data,
        )


class FakeTokenizerManager:
    """Answers ``generate_request`` with one finished output, as sglang's TokenizerManager does."""

    def __init__(self, meta_info: dict[str, Any]) -> None:
        self.meta_info = meta_info
        self.requests: list[Any] = []

    def generate_request(self, obj, request=None):
        self.requests.append(obj)

        async def stream():
            yield {"output_ids": [5, 6, 7], "meta_info": dict(self.meta_info)}

        return stream()


async def test_generate_is_the_parents_plus_entropy(tiny_model_dir, tmp_path, isolated_env):
    from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer

    config = _config(tiny_model_dir, tmp_path)
    meta_info = {
        "finish_reason": {"type": "stop"},
        "output_token_logprobs": [(-0.5, 5, None), (-0.25, 6, None), (-1.0, 7, None)],
        "output_token_entropy": [1.5, 0.75, 2.0],
    }
    server = _server(config)
    server.tokenizer_manager = FakeTokenizerManager(meta_info)
    ours = await server.generate([1, 2, 3], {"logprobs": True, "temperature": 1.0}, "rid-1")
    theirs = await SGLangHttpServer.generate(server, [1, 2, 3], {"logprobs": True, "temperature": 1.0}, "rid-2")
    assert type(ours).__name__ == "EntropyTokenOutput" and ours.entropy == [1.5, 0.75, 2.0]
    assert ours.session_aborted is False  # no session of it was aborted (test_server_abort_on_cpu.py: one that was)
    assert ours.support is None  # another entropy mode than "support"
    assert ours.model_dump(exclude={"entropy", "support", "session_aborted"}) == theirs.model_dump()
    assert server.tokenizer_manager.requests[0].return_logprob is True
    no_logprobs = await server.generate([1, 2, 3], {"temperature": 1.0}, "rid-3")
    assert no_logprobs.entropy is None and no_logprobs.token_ids == [5, 6, 7]
    del meta_info["output_token_entropy"]
    server.tokenizer_manager.meta_info = meta_info
    with pytest.raises(RuntimeError, match="no output_token_entropy"):
        await server.generate([1, 2, 3], {"logprobs": True}, "rid-4")


async def test_generate_in_support_mode_serves_the_support_and_its_renormalised_log_probs(
    tiny_model_dir, tmp_path, isolated_env
):
    # entropy mode "support" (issue 48): sglang's log-probs are over the whole tempered distribution; the server
    # hands on the ones renormalised over each token's support, and the supports
    support = [(2, 0.8, -0.2231, [5, 9]), (1, 0.5, 0.0, [6]), (429, 1.0, -1.0, None)]
    meta_info = {
        "finish_reason": {"type": "stop"},
        "output_token_logprobs": [(-0.5, 5, None), (-0.7, 6, None), (-1.0, 7, None)],
        "output_token_entropy": [0.5, 0.0, 2.0],
        "output_token_support": support,
    }
    server = _server(_config(tiny_model_dir, tmp_path))
    server.tokenizer_manager = FakeTokenizerManager(meta_info)
    out = await server.generate([1, 2, 3], {"logprobs": True, "temperature": 1.0}, "rid-1")
    assert out.support == support and out.entropy == [0.5, 0.0, 2.0]
    assert out.log_probs == [-0.2231, 0.0, -1.0]
    server.tokenizer_manager.meta_info = {**meta_info, "output_token_support": support[:2]}
    with pytest.raises(RuntimeError, match="2 supports for 3 tokens"):
        await server.generate([1, 2, 3], {"logprobs": True}, "rid-2")


@pytest.mark.parametrize(
    "rollout, error",
    [
        ({"calculate_log_probs": False}, "calculate_log_probs=True"),
        ({"data_parallel_size": 2}, "dp_size > 1"),
        ({"custom": {"entropy": {"top_k": -1, "mode": "raw"}}}, "top_k must be >= 0"),
    ],
)
async def test_launch_server_refuses_before_spawning(tiny_model_dir, tmp_path, isolated_env, rollout, error):
    server = _server(_config(tiny_model_dir, tmp_path, **rollout))
    with pytest.raises((ValueError, RuntimeError), match=error):
        await server.launch_server()
    assert not hasattr(server, "tokenizer_manager")  # nothing was launched


@pytest.mark.engine
async def test_launch_server_and_generate_sequences_match_hf(tiny_model_dir, tmp_path, isolated_env):
    from treetune_verl.agent_loop import ROLLOUT_ENTROPY_KEY
    from treetune_verl.verl.v0_7_1.worker import EntropyAgentLoopWorker

    config = _config(tiny_model_dir, tmp_path)
    server = _server(config)
    try:
        await server.launch_server()
        assert server.get_server_address()[1] > 0  # verl's uvicorn HTTP server is up
        worker = EntropyAgentLoopWorker(config, servers=[], load_balancer_handle=None)
        worker.server_manager = LocalServerManager(server)
        names = ["entropy_single_turn_agent", "entropy_tool_agent", "single_turn_agent", "entropy_single_turn_agent"]
        out = await worker.generate_sequences(make_batch(["text"] * 4, names))
    finally:
        await stop_server(server)

    assert out.batch[ROLLOUT_ENTROPY_KEY].shape == (4, RESPONSE_LENGTH)
    assert out.batch[ROLLOUT_ENTROPY_KEY].dtype == torch.float32
    for i, name in enumerate(names):
        prompt, response, mask, entropy = unpadded(out, i)
        if not name.startswith("entropy_"):
            assert not entropy.any(), "stock loop rows carry zeros"
            continue
        expected = torch.tensor(hf_token_entropy(tiny_model_dir, prompt, response), dtype=torch.float32)
        model = mask[: len(response)].bool()
        assert model.any() and (entropy[: len(response)][model] > 0).all()
        diff = (entropy[: len(response)][model] - expected[model]).abs().max().item()
        assert diff <= 1e-4, f"row {i}: rollout_entropy differs from HF recomputation by {diff:.3g} nats"
        assert not entropy[: len(response)][~model].any() and not entropy[len(response) :].any()
    # the tool loop ran model / user / model / user turns (interaction tokens carry 0.0)
    tool_mask = unpadded(out, 1)[2]
    assert int((tool_mask[1:] != tool_mask[:-1]).sum()) >= 3, tool_mask
