# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for the inference server (only), plus a tool, an interaction and checks for the agent-loop tests.

``FakeEntropyServer`` answers ``generate`` like verl's ``AsyncLLMServerManager`` / ``SGLangHttpServer`` would,
with an ``EntropyTokenOutput`` whose entropies are a known, strictly positive function of the request:
``fake_entropy(prompt_ids, k)`` for the k-th token of a reply to ``prompt_ids``. A test can therefore recompute,
from the batch alone, the value every model-generated position must hold.

What the server says is scripted by the first user message: ``"plan: tool text text"`` means turn 0 calls the
``add`` tool, turns 1 and 2 answer in text. Actions: ``text`` (short answer + EOS), ``long`` (a long answer, capped
by the token budget like the real server), ``overlong`` (ignores the budget: more tokens than asked), ``tool``
(a hermes tool call), ``bigtool`` (a tool call whose response overflows ``response_length``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from verl.interactions.base import BaseInteraction
from verl.protocol import DataProto

from treetune_tests.treetune_verl.agent_loop.fixed_length_loop import (  # noqa: F401  (re-exported)
    FIXED_LENGTH_LOOP,
    FixedLengthAgentLoop,
)
from treetune_tests.treetune_verl.agent_loop.tool_fakes import TOOL_CONFIG, AddTool  # noqa: F401  (re-exported)
from treetune_tests.treetune_verl.verl_config import compose_ppo_trainer
from treetune_verl.agent_loop.entropy_single_turn_agent_loop import EntropySingleTurnAgentLoop
from treetune_verl.rollout.token_output import EntropyTokenOutput

TEXT = "The answer is 12."
LONG = "The quick brown fox jumps over the lazy dog. " * 6
TOOL_CALL = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
BIG_TOOL_CALL = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4, "pad": 400}}</tool_call>'
ASSISTANT_HEADER = "<|im_start|>assistant"
ABORTED_ACTIONS = ("abortedtool", "empty")  # the fake's aborted replies: a partial tool call; no token at all


def fake_entropy(prompt_ids: list[int], k: int) -> float:
    """Entropy (nats) the fake serves for the k-th token of a reply to ``prompt_ids``; always in [0.1, 4.1)."""
    return 0.1 + ((sum(prompt_ids) * 7 + len(prompt_ids) * 13 + k * 29) % 997) / 250.0


class FakeEntropyServer:
    """Deterministic stand-in for the inference server (and for verl's ``AsyncLLMServerManager`` in front of it).

    Args:
        model_path: tokenizer folder (the tiny model's).
        prompt_length, response_length: the rollout config's, for the real server's token budget
            ``min(response_length, prompt_length + response_length - len(prompt_ids))``.
    """

    def __init__(self, model_path: str, prompt_length: int, response_length: int) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.calls = 0

    def _action(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids)
        turn = max(0, text.count(ASSISTANT_HEADER) - 1)
        plan = text.split("plan:", 1)[1].split("<|im_end|>", 1)[0].split() if "plan:" in text else []
        return plan[turn] if turn < len(plan) else "text"

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
    ) -> EntropyTokenOutput:
        self.calls += 1
        prompt_ids = list(prompt_ids)
        action = self._action(prompt_ids)
        eos = [self.tokenizer.eos_token_id]
        bodies = {"text": TEXT, "long": LONG, "overlong": LONG * 2, "tool": TOOL_CALL, "bigtool": BIG_TOOL_CALL}
        # aborted requests: partial tokens (a tool call) or none, no end-of-sequence
        bodies |= {"abortedtool": TOOL_CALL, "empty": ""}
        ends = "long" not in action and action not in ABORTED_ACTIONS
        token_ids = self.tokenizer.encode(bodies[action], add_special_tokens=False) + (eos if ends else [])
        budget = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        if action != "overlong":
            token_ids = token_ids[: max(0, budget)]
        want_entropy = bool(sampling_params.get("logprobs", False))
        entropy = [fake_entropy(prompt_ids, k) for k in range(len(token_ids))]
        return EntropyTokenOutput(
            token_ids=token_ids,
            log_probs=[-value / 2 for value in entropy] if want_entropy else None,
            entropy=entropy if want_entropy else None,
            stop_reason="abort" if action in ABORTED_ACTIONS else "stop" if token_ids[-1:] == eos else "length",
            extra_fields={"global_steps": 3},
        )


class ScriptedInteraction(BaseInteraction):
    """A user who says "Please continue." once, then "Done." and ends the conversation."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.turns: dict[str, int] = {}

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any):
        turn = self.turns.get(instance_id, 0)
        self.turns[instance_id] = turn + 1
        if turn == 0:
            return False, "Please continue.", 0.25, {}
        return True, "Done.", 1.0, {}


class SlowInteraction(ScriptedInteraction):
    """The scripted user, thinking ``SLOW_USER_S`` seconds before each reply: a trajectory sits between its turns,
    outside the inference server, for that long (over-sampling aborts it there). With ``SLOW_USER_LOG`` set in the
    environment, each reply appends ``start <wall time>`` and ``end <wall time>`` lines to that file."""

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any):
        _log_slow_user("start")
        await asyncio.sleep(SLOW_USER_S)
        response = await super().generate_response(instance_id, messages, **kwargs)
        _log_slow_user("end")
        return response


def _log_slow_user(event: str) -> None:
    path = os.environ.get(SLOW_USER_LOG)
    if path:
        with open(path, "a") as log:
            log.write(f"{event} {time.time()}\n")


SLOW_USER_S = 3.0
SLOW_USER_LOG = "TREETUNE_TEST_SLOW_USER_LOG"
FAILING_LOOP = {"name": "failing_agent", "_target_": f"{__name__}.FailingAgentLoop"}
FAILURE = "the tool this task needs is down"
INTERACTION_CONFIG = {
    "interaction": [
        {"name": "scripted", "class_name": f"{__name__}.ScriptedInteraction", "config": {}},
        {"name": "slow", "class_name": f"{__name__}.SlowInteraction", "config": {}},
    ]
}


class FailingAgentLoop(EntropySingleTurnAgentLoop):
    """The entropy single-turn loop that raises after its model turn (a tool or environment that fails), like an agent
    whose environment breaks mid-episode. Select it through an ``agent_loop_config_path`` entry
    (:data:`FAILING_LOOP`)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any):
        await super().run(sampling_params, **kwargs)
        raise RuntimeError(FAILURE)


def tool_overrides(workdir: Path) -> list[str]:
    """Overrides selecting the fake tool and interactions (their configs written into ``workdir``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    tool_path, interaction_path = workdir / "tools.json", workdir / "interactions.json"
    tool_path.write_text(json.dumps(TOOL_CONFIG))  # JSON is YAML; OmegaConf.load reads it
    interaction_path.write_text(json.dumps(INTERACTION_CONFIG))
    return [
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_path}",
        f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interaction_path}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
    ]


def compose_config(
    model_path: Path | str,
    workdir: Path,
    prompt_length: int = 64,
    response_length: int = 128,
    extra: list[str] | None = None,
):
    """verl 0.7.1's ``ppo_trainer`` composed by Hydra with the README override block and a tool/interaction setup."""
    return compose_ppo_trainer(model_path, prompt_length, response_length, tool_overrides(workdir) + (extra or []))


def make_batch(plans: list[str], agent_names: list[str] | None, interactions: list[str] | None = None) -> DataProto:
    """The rollout input verl's trainer hands the agent loops: one chat prompt per row plus its loop name
    (no ``agent_name`` column when ``agent_names`` is ``None``: verl then uses ``agent.default_agent_loop``) and
    the interaction of its tool loop (``"scripted"`` unless ``interactions`` says otherwise)."""
    n = len(plans)
    raw_prompt = np.empty(n, dtype=object)
    raw_prompt[:] = [[{"role": "user", "content": f"plan: {plan}"}] for plan in plans]
    interactions = interactions or ["scripted"] * n
    extra_info = np.array(
        [{"interaction_kwargs": {"name": name}, "index": i} for i, name in enumerate(interactions)], dtype=object
    )
    non_tensors = {"raw_prompt": raw_prompt, "extra_info": extra_info, "index": np.arange(n)}
    if agent_names is not None:
        non_tensors["agent_name"] = np.array(agent_names, dtype=object)
    return DataProto.from_dict(non_tensors=non_tensors, meta_info={"global_steps": 1})


def unpadded(batch: DataProto, i: int) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
    """Row ``i``'s prompt ids, valid response ids, and its ``[R]`` response_mask and rollout_entropy."""
    prompt_length = batch.batch["prompts"].shape[1]
    attention = batch.batch["attention_mask"][i]
    prompt = batch.batch["prompts"][i][attention[:prompt_length].bool()].tolist()
    num_response = int(attention[prompt_length:].sum())
    response = batch.batch["responses"][i][:num_response].tolist()
    return prompt, response, batch.batch["response_mask"][i], batch.batch["rollout_entropy"][i]


def last_token_scores(batch: DataProto) -> list[float]:
    """Each row's ``rm_scores`` at its last response token; asserts the row is 0 everywhere else."""
    prompt_length = batch.batch["prompts"].shape[1]
    last = batch.batch["attention_mask"][:, prompt_length:].sum(-1) - 1
    rows = torch.arange(len(batch))
    scores = batch.batch["rm_scores"].clone()
    at_last = scores[rows, last].tolist()
    scores[rows, last] = 0.0
    assert not scores.any(), "rm_scores must be zero except at each row's last response token"
    return at_last


def expected_entropy(prompt: list[int], response: list[int], mask: torch.Tensor) -> torch.Tensor:
    """``[R]`` float32: what the fake served at each model token (runs of ``mask == 1``), 0.0 elsewhere."""
    expected = torch.zeros(mask.shape[0], dtype=torch.float32)
    start = None
    for j in range(len(response) + 1):
        inside = j < len(response) and bool(mask[j])
        if inside and start is None:
            start = j
        if start is not None and not inside:
            context = prompt + response[:start]
            expected[start:j] = torch.tensor([fake_entropy(context, k) for k in range(j - start)], dtype=torch.float32)
            start = None
    return expected


def assert_served_entropy(batch: DataProto, i: int, carries_entropy: bool = True) -> None:
    """Row ``i``: ``rollout_entropy != 0`` exactly at model tokens, holding the served values (zeros if not carried)."""
    prompt, response, mask, entropy = unpadded(batch, i)
    assert entropy.dtype == torch.float32
    if not carries_entropy:
        assert torch.equal(entropy, torch.zeros_like(entropy)), f"row {i}: stock loop row must be all zeros"
        return
    assert torch.equal(entropy != 0, mask.bool()), f"row {i}: nonzero entropy must sit exactly at response_mask"
    assert torch.equal(entropy, expected_entropy(prompt, response, mask)), f"row {i}: values differ from served"
