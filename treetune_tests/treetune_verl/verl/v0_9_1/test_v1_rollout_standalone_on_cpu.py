# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The middle test on the current stack: verl 0.9.1's rollout path with our block, on real Ray and a real sglang 0.5.12
CPU Engine, rows read back as the V1 trainer reads them.

verl 0.9.1's ``LLMServerManager.create(config)`` with no worker group is its standalone mode (``init_standalone``: a
placement group of its own, our ``EntropySGLangReplica`` chosen by the block in ``LLMServerManager.__init__``, which
the actor entry point imported here wraps, launching ``EntropySGLangHttpServer`` with a real Engine). The block's
manager (``EntropyAgentLoopManager``: verl's ``AgentLoopManagerTQ``) starts two ``AgentLoopWorkerTQ`` actors, which run
our loops through verl's ``LLMServerClient`` and put every row into TransferQueue; the test reads them back with the
V1 seam's own reader (``trainer_seams.read_rollout_entropy``: ``rollout_entropy`` / ``has_rollout_entropy`` from each
row's ``extra_fields``). Nothing of the rollout path is a stand-in; the CPU needs only configuration (a declared GPU,
the CPU engine settings; ``standalone.py``) and none of the CPU runtime patches.

The tool loop goes model / tool / model / tool / model: the test's tool parser asks for ``add(2, 3)`` after every
model turn (``current_stack_fakes.py``), so each tool response goes through verl's Continuous Token context merge.

Checked: each entropy row equals an independent teacher-forced HF recomputation (``torch.log_softmax`` in float64,
``standalone.teacher_forced``) at every ``response_mask`` position within 1e-4 nats and is 0.0 elsewhere, while the
row misaligned by one position either way, or all zeros, would fail; verl's ``rollout_log_probs`` agree with the
recomputation's log-probability of each sampled token; ``has_rollout_entropy`` is False exactly for the stock
``single_turn_agent`` row; nothing of the run is left after ``ray.shutdown()``.

The second test is managed sessions of two rows each (its docstring); the third is over-sampling on verl 0.9.1: the
same path with our ``OverSamplingAgentLoopWorkerTQ`` workers and our replay buffer (``OverSampleReplayBuffer``)
sampling as the V1 trainer does (its docstring).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import ray
import torch
import yaml
from omegaconf import open_dict

from treetune_tests.treetune_verl.agent_loop.fixed_length_loop import FIXED_LENGTH_LOOP
from treetune_tests.treetune_verl.agent_loop.standalone import (
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    check_entropy_row,
    driver_state_restored,  # noqa: F401  (fixture, used below)
    last_turn_start,
    load_weights,
    model_with_short_turns,
    other_weights,
    ray_session,
    teacher_forced,
)
from treetune_tests.treetune_verl.verl_config import compose_ppo_trainer
from treetune_verl.batch_keys import FORECAST_EVAL_PLAN_KEY, HAS_ROLLOUT_ENTROPY_KEY, ROLLOUT_ENTROPY_KEY
from treetune_verl.sglang.engine import CPU_ENGINE_KWARGS
from treetune_verl.trainer.features import SAMPLER_KEY, SAMPLER_NAME, SAMPLER_PATH

pytestmark = [
    pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)"),
    pytest.mark.usefixtures("driver_state_restored"),
]

ATOL = 1e-4  # nats
NAMES = ["entropy_single_turn_agent", "entropy_tool_agent_calls", "single_turn_agent", "entropy_tool_agent_calls"]
WAIT_S = 600


def _config(model_path, workdir, loops=(), overrides=(), response_length=RESPONSE_LENGTH):
    """verl 0.9.1's trainer config for a standalone rollout of the block on the CPU Engine; ``loops``: more
    ``agent_loop_config_path`` entries; ``overrides``: more Hydra overrides (which must not repeat a key set here)."""
    from treetune_tests.treetune_verl.agent_loop.tool_fakes import TOOL_CONFIG
    from treetune_tests.treetune_verl.verl.v0_9_1.current_stack_fakes import ALWAYS_ADD, TOOL_CALLING_LOOP

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tools.yaml").write_text(yaml.safe_dump(TOOL_CONFIG))
    (workdir / "loops.yaml").write_text(yaml.safe_dump([TOOL_CALLING_LOOP, *loops]))
    config = compose_ppo_trainer(
        model_path,
        PROMPT_LENGTH,
        response_length,
        [
            "actor_rollout_ref.model.external_lib=treetune_verl.verl.process_setup",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={workdir / 'tools.yaml'}",
            f"actor_rollout_ref.rollout.multi_turn.format={ALWAYS_ADD}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={workdir / 'loops.yaml'}",
            "actor_rollout_ref.rollout.agent.num_workers=2",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            *overrides,
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
            # verl 0.7.1's server switched a standalone rollout from dummy to real weights itself
            # (async_sglang_server.py:110); verl 0.9.1's serves rollout.load_format as given (dummy by default)
            "actor_rollout_ref.rollout.load_format=auto",
            "+actor_rollout_ref.rollout.engine_kwargs.sglang.disable_piecewise_cuda_graph=True",
        ],
    )
    with open_dict(config):
        config.actor_rollout_ref.rollout.engine_kwargs.sglang.update(
            {**CPU_ENGINE_KWARGS, "enable_memory_saver": False, "random_seed": 0}
        )
    return config


def _prompts(names: list[str], contents: list[str] | None = None, global_steps: int = 1, rollout_n: int | None = None):
    """One prompt per loop name, as the V1 trainer hands them to the manager (a fresh ``uid`` each); ``rollout_n``:
    each prompt's rows instead of ``rollout.n`` (verl's per-prompt ``__rollout_n__``, agent_loop_tq.py)."""
    from verl.utils import tensordict_utils as tu

    n = len(names)
    contents = contents or [f"plan {i}: add two numbers" for i in range(n)]
    raw_prompt = np.empty(n, dtype=object)
    raw_prompt[:] = [[{"role": "user", "content": content}] for content in contents]
    batch = tu.get_tensordict(
        {
            "raw_prompt": raw_prompt,
            "agent_name": np.array(names, dtype=object),
            "index": np.arange(n),
            "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
            "uid": np.array([str(uuid.uuid4()) for _ in range(n)], dtype=object),
            # what verl's reward function reads (rewards.counted_score, the managed test's)
            "data_source": np.array(["v1"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": "-"}] * n, dtype=object),
        }
    )
    if rollout_n is not None:
        batch["__rollout_n__"] = torch.full((n,), rollout_n)  # a row's 0-d tensor is an index (range(n))
    tu.assign_non_tensor_data(batch, "global_steps", global_steps)
    return batch


def _dispatch(manager, names: list[str], contents: list[str] | None = None, global_steps: int = 1, rollout_n=None):
    """As the V1 trainer dispatches (``_submit_batch_to_rollout``): the prompts (:func:`_prompts`) registered
    ``pending`` in TransferQueue, then handed to ``manager``; their uids, in order."""
    import transfer_queue as tq

    prompts = _prompts(names, contents, global_steps=global_steps, rollout_n=rollout_n)
    uids = list(prompts["uid"])
    tags = [{"is_prompt": True, "status": "pending", "global_steps": global_steps} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
    manager.generate_sequences(prompts)
    return uids


def _wait_for_rows(tq, uids: list[str]) -> dict[str, dict]:
    """Each prompt's row key -> tags, once every prompt is finished (the agent-loop workers put them)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        listed = tq.kv_list(partition_id="train").get("train", {})
        if all(listed.get(uid, {}).get("status") in ("finished", "failure") for uid in uids):
            assert all(listed[uid]["status"] == "finished" for uid in uids), {uid: listed[uid] for uid in uids}
            return {key: tags for key, tags in listed.items() if key not in uids}
        time.sleep(1)
    raise AssertionError(f"rows not in TransferQueue after {WAIT_S} s")


@contextlib.contextmanager
def _v1_rollout(config, monkeypatch, reward_worker: bool = False) -> Iterator[tuple]:
    """Real Ray, TransferQueue, verl 0.9.1's standalone servers (our replica, chosen by the actor entry point) and the
    block's manager: ``(session, servers, replica, manager)``; the caller checks ``session.left`` after the block.
    ``reward_worker``: the manager's workers score rows through one real verl ``RewardLoopWorker`` (``config.reward``),
    as the trainer's reward loop manager hands them its workers."""
    import transfer_queue as tq
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.workers.rollout.llm_server import LLMServerManager

    import treetune_verl.verl.process_setup  # noqa: F401  (external_lib: what verl imports in the trainer's process)
    from treetune_verl.verl import EntropyAgentLoopManager

    monkeypatch.setenv("TRANSFER_QUEUE_ENABLE", "1")
    with ray_session(monkeypatch) as session:
        tq.init(config.transfer_queue)
        try:
            servers = LLMServerManager.create(config=config)
            [replica] = servers.get_replicas()
            rewards = [ray.remote(RewardLoopWorker).options(num_cpus=0).remote(config)] if reward_worker else None
            manager = EntropyAgentLoopManager.create(
                config=config, llm_client=servers.get_client(), teacher_client=None, reward_loop_worker_handles=rewards
            )
            session.track(*replica.workers, *replica.servers, *manager.agent_loop_workers, *(rewards or []))
            yield session, servers, replica, manager
        finally:
            tq.close()


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_v1_rollout_real_engine_matches_hf(tiny_model_dir, tmp_path, monkeypatch):
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from transformers import AutoModelForCausalLM

    from treetune_verl.verl.v0_9_1.rollout_eval import EVAL_PARTITION, take_rollout_eval
    from treetune_verl.verl.v0_9_1.trainer_seams import read_rollout_entropy, response_tokens, trained_uids

    model_path = model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    config = _config(model_path, tmp_path / "cfg", overrides=["actor_rollout_ref.rollout.n=1"])
    with open_dict(config):  # the live forecast: E of half the prompts (rb_residual: rollout.n = 1)
        config.actor_rollout_ref.rollout.custom = {"entropy_forecast": {"every": 1, "estimators": ["rb_residual"]}}
    with _v1_rollout(config, monkeypatch) as (session, servers, replica, manager):
        assert type(replica).__name__ == "EntropySGLangReplica" and replica.rollout_mode.value == "standalone"
        uids = _dispatch(manager, NAMES)
        rows = _wait_for_rows(tq, uids)
        keys = [f"{uid}_0_0" for uid in uids]  # one session (n=1), one output each
        assert sorted(rows) == sorted(keys), sorted(rows)
        batch = KVBatchMeta(keys=keys, tags=[rows[key] for key in keys], partition_id="train")
        built, masks = read_rollout_entropy(batch)
        data = tq.kv_batch_get(keys=keys, partition_id="train")
        assert FORECAST_EVAL_PLAN_KEY not in data, "E's plan became a field of the rows"
        prompts_ids = [p.tolist() for p in data["prompts"].unbind(0)]
        responses = [r.tolist() for r in data["responses"].unbind(0)]
        log_probs = list(data["rollout_log_probs"].unbind(0))
        E, eval_metrics = take_rollout_eval(manager.rollout_eval, response_tokens(batch), trained_uids(batch))
        assert tq.kv_list(partition_id=EVAL_PARTITION).get(EVAL_PARTITION, {}) == {}, "E left in TransferQueue"
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    # E: the first half of the sorted uids (eval_share 0.5), each prompt as its row's loop rendered it (the tool
    # loop's with the tool schemas), rollout.n responses from requests of their own, up to the budget
    assert E is not None and E.uids == sorted(uids)[:2], (E and E.uids, sorted(uids))
    stop_ids = set(json.loads((model_path / "config.json").read_text())["eos_token_id"])  # model_with_short_turns
    for uid, prompt, E_responses, request_ids in zip(E.uids, E.prompt_ids, E.response_ids, E.request_ids, strict=True):
        assert prompt.tolist() == prompts_ids[uids.index(uid)], f"uid {uid}: E's prompt is not its row's"
        assert len(E_responses) == len(request_ids) == 1
        for response in E_responses:
            # it ends at its first end id, or at the budget
            assert 0 < len(response) <= RESPONSE_LENGTH and not stop_ids & set(response[:-1].tolist())
            assert response[-1] in stop_ids or len(response) == RESPONSE_LENGTH
        assert all(key.startswith("forecast-eval-") for key in request_ids)
    assert len({key for keys_ in E.request_ids for key in keys_}) == len(E.uids)
    assert E.budget == RESPONSE_LENGTH
    eval_tokens = sum(len(r) for responses_ in E.response_ids for r in responses_)
    share = eval_tokens / (eval_tokens + sum(len(r) for r in responses))  # over every response token (as 0.7.1)
    assert eval_metrics["probe/eval_gen_s"] > 0 and eval_metrics["probe/eval_gen_token_share"] == share

    assert [bool(row[HAS_ROLLOUT_ENTROPY_KEY]) for row in built] == [name.startswith("entropy_") for name in NAMES]
    hf = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    for i, name in enumerate(NAMES):
        got, mask = built[i][ROLLOUT_ENTROPY_KEY].double(), masks[i].bool()
        assert got.shape == mask.shape == (len(responses[i]),) and mask.any(), f"row {i}: no model-generated token"
        if not name.startswith("entropy_"):
            assert not got.any(), f"row {i} ({name}, stock loop) must be all zeros"
            continue
        expected, token_logp = teacher_forced(hf, prompts_ids[i], responses[i])
        error, late, early, zeros = check_entropy_row(f"row {i} ({name})", got, expected, mask, ATOL)
        logprob_error = (log_probs[i].double() - token_logp)[mask].abs().max()
        assert logprob_error <= 1e-3, f"row {i}: rollout_log_probs differ from HF by {logprob_error:.3g}"
        print(
            f"row {i} {name}: {len(responses[i])} response tokens, {int(mask.sum())} model tokens, |entropy - HF| "
            f"{error:.2e} (late / early / zeros: {late:.2f} / {early:.2f} / {zeros:.2f}), |logprob - HF| "
            f"{logprob_error:.2e}"
        )
    # the tool rows went model / tool / model / ...: tool tokens carry 0.0 (checked above)
    for i in (1, 3):
        runs = int((masks[i][1:] != masks[i][:-1]).sum())
        assert runs >= 2, masks[i]


# Managed sessions of two rows each, with the agent's own reward: the second test.
MANAGED_N, ROWS_PER_SESSION = 4, 2  # rollout.n; rows per session: a prompt's 4 rows are 2 sessions
MANAGED_LOOP = "treetune_verl.managed.agent_loop.ManagedAgentLoop"
AGENTS = "treetune_tests.treetune_verl.managed.agents"
MANAGED_LOOPS = [  # one managed loop per agent (the agent named in the loop's entry)
    {"name": "managed_scored", "_target_": MANAGED_LOOP, "agent_fn": f"{AGENTS}:branching_agent"},
    {"name": "managed_unscored", "_target_": MANAGED_LOOP, "agent_fn": f"{AGENTS}:unscored_branching_agent"},
]


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_v1_managed_sessions_of_two_scored_branches_are_rows_of_their_group(tiny_model_dir, tmp_path, monkeypatch):
    """Two prompts of ``agents.branching_agent`` (a turn, a masked follow-up, two branches of the answer, each scored by
    the agent) and two of the same branches unscored, ``rollout.n=4``, ``rows_per_session=2``, one real verl reward
    worker whose reward function (``rewards.counted_score``) records each call. Each prompt's 4 rows reach
    TransferQueue as 4 sessions of one output (``{uid}_{s}_0``), each with its own ``rm_scores`` at its last response
    token, the agent's or (unscored) verl's reward function's, which runs for the unscored rows only; verl's GRPO
    (``compute_advantage_for_multi_trajectories``, as the V1 trainer calls it) gives every row its own advantage; the
    entropy and log-probs are within 1e-4 of HF at model tokens, 0 elsewhere; the ``managed/*`` metrics."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from transformers import AutoModelForCausalLM
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    from treetune_tests.treetune_verl.managed import rewards
    from treetune_tests.treetune_verl.managed.agents import branch_score
    from treetune_verl.verl.v0_9_1.trainer_seams import managed_metrics, read_rollout_entropy

    model_path = model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    calls_file = tmp_path / "reward_calls.txt"
    calls_file.touch()
    overrides = [
        f"actor_rollout_ref.rollout.n={MANAGED_N}",
        f"+actor_rollout_ref.rollout.custom.managed.rows_per_session={ROWS_PER_SESSION}",
        f"reward.custom_reward_function.path={rewards.__file__}",
        "reward.custom_reward_function.name=counted_score",
        f"+reward.custom_reward_function.reward_kwargs.calls_file={calls_file}",
    ]
    config = _config(model_path, tmp_path / "cfg", loops=MANAGED_LOOPS, overrides=overrides)
    names = ["managed_scored", "managed_scored", "managed_unscored", "managed_unscored"]
    with _v1_rollout(config, monkeypatch, reward_worker=True) as (session, servers, replica, manager):
        uids = _dispatch(manager, names)
        rows = _wait_for_rows(tq, uids)
        keys = [f"{uid}_{s}_0" for uid in uids for s in range(MANAGED_N)]  # one output per session, n sessions
        assert sorted(rows) == sorted(keys), sorted(rows)
        batch = KVBatchMeta(keys=keys, tags=[rows[key] for key in keys], partition_id="train")
        built, masks = read_rollout_entropy(batch)
        fields = ["prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores", "extra_fields"]
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=fields)
        prompts_ids = [p.tolist() for p in data["prompts"].unbind(0)]
        responses = [r.tolist() for r in data["responses"].unbind(0)]
        log_probs = list(data["rollout_log_probs"].unbind(0))
        scores = list(data["rm_scores"].unbind(0))
        extra_fields = data.pop("extra_fields").tolist()
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    # row r = prompt r // 4, session r % 4 = its (r % 4 // 2)-th session's branch r % 2
    prompt_of, branch_of = [r // MANAGED_N for r in range(len(keys))], [r % 2 for r in range(len(keys))]
    expected = [
        branch_score(p, b) if names[p] == "managed_scored" else rewards.COUNTED_SCORE
        for p, b in zip(prompt_of, branch_of, strict=True)
    ]
    for r, score in enumerate(scores):
        assert score[-1].item() == pytest.approx(expected[r]) and not score[:-1].any(), f"row {keys[r]}: {score}"
    assert sorted(calls_file.read_text().split()) == ["2"] * 4 + ["3"] * 4  # the unscored prompts' rows only
    assert [f.get("reward_extra_info", {}).get("branch") for f in extra_fields[:8]] == [0.0, 1.0] * 4

    # verl's GRPO over the rows, as the V1 trainer calls it: each row its own advantage in a group of 4
    rewards_per_token = torch.nn.utils.rnn.pad_sequence(scores, batch_first=True)
    response_mask = torch.nn.utils.rnn.pad_sequence(masks, batch_first=True)
    grpo = DataProto.from_dict(
        tensors={"token_level_rewards": rewards_per_token, "response_mask": response_mask},
        non_tensors={"uid": np.array([uids[p] for p in prompt_of], dtype=object)},
    )
    grpo = compute_advantage_for_multi_trajectories(grpo, keys, AdvantageEstimator.GRPO, num_repeat=MANAGED_N)
    group = torch.tensor(expected, dtype=torch.float32).view(len(uids), MANAGED_N)
    want = ((group - group.mean(-1, keepdim=True)) / (group.std(-1, keepdim=True) + 1e-6)).flatten()
    first = response_mask.argmax(dim=1)
    got = grpo.batch["advantages"][torch.arange(len(keys)), first]
    assert torch.allclose(got, want, atol=1e-5), (got, want)
    assert got[:8].abs().min() > 0.1  # the scored groups' branches differ: no row took its sibling's advantage

    metrics = managed_metrics(extra_fields, [False] * len(keys))
    assert metrics["managed/rows_per_session/mean"] == metrics["managed/branches_per_session/mean"] == 2
    assert metrics["managed/agent_scored_ratio"] == 0.5 and metrics["managed/turns_per_row/mean"] == 2
    assert metrics["managed/agent_reward/mean"] == pytest.approx(np.mean(expected[:8]))

    hf = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    worst = 0.0
    for r, key in enumerate(keys):
        got_entropy, mask = built[r][ROLLOUT_ENTROPY_KEY].double(), masks[r].bool()
        expected_entropy, token_logp = teacher_forced(hf, prompts_ids[r], responses[r])
        error, *_ = check_entropy_row(f"row {key}", got_entropy, expected_entropy, mask, ATOL)
        logprob_error = (log_probs[r].double() - token_logp)[mask].abs().max().item()
        assert logprob_error <= ATOL, f"row {key}: rollout_log_probs differ from HF by {logprob_error:.3g}"
        worst = max(worst, error, logprob_error)
    for r in range(0, len(keys), 2):  # a session's two rows: one prompt, identical tokens up to their branch
        start = last_turn_start(masks[r])
        assert prompts_ids[r] == prompts_ids[r + 1] and start == last_turn_start(masks[r + 1])
        assert responses[r][:start] == responses[r + 1][:start]
    print(f"{len(keys)} rows; GRPO advantages {got.tolist()}; largest |entropy or log-prob - HF| {worst:.2e}")


# Over-sampling (verl 0.9.1's replay buffer): the third test.
LONG = 4 * RESPONSE_LENGTH  # tokens of a slow row (the tiny model has 1024 positions)
GROUPS = {  # group -> (loop, prompt), in the batch's order
    "A": ("entropy_single_turn_agent", "A: say something short"),
    "C": ("fixed_length_agent", f"C: tokens={LONG}"),
    "B": ("entropy_single_turn_agent", "B: say something short"),
    "D": ("fixed_length_agent", f"D: tokens={LONG}"),
}
N = 2  # rollout.n


def _buffer_class():
    from treetune_verl.verl.v0_9_1.over_sample_sampler import OverSampleReplayBuffer

    class RecordingBuffer(OverSampleReplayBuffer):
        """Ours, remembering the tags of the rows it removes (their lengths at the abort)."""

        removed: dict[str, dict] = {}

        def _clear_groups(self, partition_id, uids):
            rows = self.partitions[partition_id]
            self.removed.update({key: dict(tag) for key, tag in rows.items() if key.split("_")[0] in uids})
            super()._clear_groups(partition_id, uids)

    return RecordingBuffer


def _sync_buffer(buffer_class=None):
    """Our replay buffer (or ``buffer_class``) as verl 0.9.1's sync trainer builds it (``_build_replay_buffer``, with
    no off-policy bound)."""
    from treetune_verl.verl.v0_9_1.over_sample_sampler import OverSampleReplayBuffer

    return (buffer_class or OverSampleReplayBuffer)(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
    )


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_v1_over_sampling_trains_the_first_whole_groups_and_aborts_the_rest(tiny_model_dir, tmp_path, monkeypatch):
    """4 prompts x ``rollout.n = 2`` = 4 groups of 2 rows, heavy-tailed and deterministic on a random model: groups A
    and B run the entropy single-turn loop on the short-turn model (a turn ends after a few tokens), groups C and D
    the fixed-length loop, which ignores end-of-sequence and runs to ``response_length`` = :data:`LONG` tokens
    (``fixed_length_loop.py``). With ``over_sample_rate=0.5`` the target is ``ceil(0.5 * 4) = 2`` whole groups. The
    prompts go A, C, B, D, so each of verl's two workers (it chunks the batch in order) runs a fast and a slow
    group: a worker that starts late delays both. A fast group completes after its few tokens plus verl's per-row
    overhead (scoring, TransferQueue), measured at about 70 decode steps of the slow rows here, hence the long
    ``LONG``.

    Checked, on two consecutive steps (the trainer's order: prompts registered ``pending`` in TransferQueue, the
    manager dispatches them, the buffer samples): the batch is exactly the 4 rows of A and B; C and D were cut by
    the abort (each of their rows had fewer than ``response_length`` tokens when removed: without the group-named
    request ids the abort would reach nothing and they would run to the end) and are gone from TransferQueue with
    their prompts; the servers remember no aborted session afterwards; the kept rows' entropy equals an independent
    teacher-forced HF recomputation within 1e-4 nats; the metrics count 2 groups / 4 rows aborted; nothing of the
    run is left after ``ray.shutdown()``.
    """
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from transformers import AutoModelForCausalLM
    from verl.utils.import_utils import load_extern_type

    import treetune_verl.verl.process_setup  # noqa: F401  (external_lib: what verl imports in the trainer's process)
    from treetune_verl.verl.v0_9_1.over_sample_sampler import OverSampleReplayBuffer
    from treetune_verl.verl.v0_9_1.trainer_seams import read_rollout_entropy

    # the keys the block sets are the ones verl loads the buffer by (trainer_base.py _build_replay_buffer)
    assert load_extern_type(SAMPLER_PATH, SAMPLER_NAME) is OverSampleReplayBuffer
    model_path = model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    overrides = [
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.over_sample_rate=0.5",
        f"{SAMPLER_KEY}.path={SAMPLER_PATH}",
        f"{SAMPLER_KEY}.name={SAMPLER_NAME}",
    ]
    config = _config(model_path, tmp_path / "cfg", loops=[FIXED_LENGTH_LOOP], overrides=overrides, response_length=LONG)
    monkeypatch.setenv("TRANSFER_QUEUE_ENABLE", "1")
    names, contents = zip(*GROUPS.values(), strict=True)
    kept_rows = []
    with _v1_rollout(config, monkeypatch) as (session, servers, replica, manager):
        assert all("EntropyAgentLoopWorkerTQ" in repr(w) for w in manager.agent_loop_workers)
        buffer = _sync_buffer(_buffer_class())
        for step in (1, 2):
            uids = dict(zip(GROUPS, _dispatch(manager, list(names), list(contents), step), strict=True))
            buffer.removed.clear()
            batch, metrics = buffer.sample(global_steps=step, partition_id="train", batch_size=len(uids))

            expected = sorted(f"{uids[g]}_{s}_0" for g in "AB" for s in range(N))
            assert sorted(batch.keys) == expected, f"step {step}: {batch.keys}"
            aborted = {key: tag for key, tag in buffer.removed.items() if key.split("_")[0] in (uids["C"], uids["D"])}
            assert len(aborted) == len(buffer.removed) == 2 * N, f"step {step}: removed {sorted(buffer.removed)}"
            lengths = sorted(tag["response_len"] for tag in aborted.values())
            assert max(lengths) < LONG, f"step {step}: C / D not cut by the abort: {lengths}"
            assert metrics["rollout/aborted_groups"] == 2 and metrics["rollout/aborted_rows"] == 2 * N
            assert metrics["rollout/aborted_ratio"] == 0.5
            listed = tq.kv_list(partition_id="train").get("train", {})
            assert sorted(listed) == expected, f"step {step}: TransferQueue still holds {sorted(listed)}"
            assert ray.get([s.aborted_session_count.remote() for s in servers.server_handles]) == [0]
            print(
                f"step {step}: kept A, B; C / D rows cut at {lengths} tokens (of {LONG}); "
                f"abort to settled {metrics['rollout/abort_wait_s']:.2f} s"
            )
            if step == 1:
                meta = KVBatchMeta(keys=expected, tags=[listed[key] for key in expected], partition_id="train")
                built, masks = read_rollout_entropy(meta)
                data = tq.kv_batch_get(keys=expected, partition_id="train", select_fields=["prompts", "responses"])
                kept_rows = [
                    (p.tolist(), r.tolist(), row[ROLLOUT_ENTROPY_KEY].double(), mask.bool())
                    for p, r, row, mask in zip(
                        data["prompts"].unbind(0), data["responses"].unbind(0), built, masks, strict=True
                    )
                ]
            tq.kv_clear(partition_id="train", keys=expected)  # the trainer's end of step
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    hf = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    for i, (prompt_ids, response_ids, got, mask) in enumerate(kept_rows):
        assert mask.any(), f"kept row {i}: no model-generated token"
        reference, _ = teacher_forced(hf, prompt_ids, response_ids)
        error, *_ = check_entropy_row(f"kept row {i}", got, reference, mask, ATOL)
        print(f"kept row {i}: {len(response_ids)} tokens, |entropy - HF| {error:.2e}")


# Failed rows aborted (verl 0.9.1): a row whose agent loop raises drops its group.
FAILING_GROUPS = {  # group -> (loop, prompt); B's second row raises after its model turn
    "A": ("entropy_single_turn_agent", "A: say something short"),
    "B": ("fixed_length_agent", "B: tokens=8 fail=1"),
    "C": ("entropy_single_turn_agent", "C: say something short"),
}


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_v1_a_failing_row_drops_its_group_with_failed_rows_aborted(tiny_model_dir, tmp_path, monkeypatch):
    """``abort_failed_rows=true`` without over-sampling (rate 0), through the real rollout path and our buffer with
    the run's own features (read from the servers' config): 3 groups of 2, one row of B raises after its model turn
    (verl's worker marks B ``failure`` once both rows settled). The step trains A and C whole; B's finished row is
    removed with its prompt and counted. The same step with the key off is verl's: B trains with the one row left."""
    import dataclasses

    import transfer_queue as tq

    model_path = model_with_short_turns(tiny_model_dir, tmp_path / "tiny-short-turns")
    overrides = [
        f"actor_rollout_ref.rollout.n={N}",
        "+actor_rollout_ref.rollout.custom.over_sample.abort_failed_rows=true",
        f"{SAMPLER_KEY}.path={SAMPLER_PATH}",
        f"{SAMPLER_KEY}.name={SAMPLER_NAME}",
    ]
    config = _config(model_path, tmp_path / "cfg", loops=[FIXED_LENGTH_LOOP], overrides=overrides)
    names, contents = zip(*FAILING_GROUPS.values(), strict=True)
    batches = []
    with _v1_rollout(config, monkeypatch) as (session, servers, replica, manager):
        buffer = _sync_buffer()
        for step, failed_rows_aborted in ((1, True), (2, False)):
            if not failed_rows_aborted:
                buffer.features = dataclasses.replace(buffer.features, abort_failed_rows=False)
            step_contents = [f"{c} step {step}" for c in contents]  # new texts: the loop counts rows per text
            uids = dict(zip(FAILING_GROUPS, _dispatch(manager, list(names), step_contents, step), strict=True))
            batch, metrics = buffer.sample(global_steps=step, partition_id="train", batch_size=len(uids))
            listed = tq.kv_list(partition_id="train").get("train", {})
            kept = sorted({g for g, uid in uids.items() for key in batch.keys if key.startswith(uid)})
            rows = {g: sum(key.startswith(uids[g]) for key in batch.keys) for g in kept}
            batches.append((kept, rows, metrics, sorted(listed) == sorted(batch.keys)))
            tq.kv_clear(partition_id="train", keys=batch.keys)
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    (kept, rows, metrics, only_kept_left), (stock_kept, stock_rows, stock_metrics, _) = batches
    assert buffer.features.over_sample_rate == 0
    assert kept == ["A", "C"] and rows == {"A": N, "C": N}, (kept, rows)
    assert only_kept_left, "B's finished row or its prompt left in TransferQueue"
    assert metrics["rollout/failed_groups"] == metrics["rollout/aborted_groups"] == 1
    # every row of the dropped group, the one that raised included (as verl 0.7.1's manager counts it)
    assert metrics["rollout/aborted_rows"] == N and metrics["rollout/failed_rows"] == 1
    assert metrics["rollout/aborted_tokens"] == 8
    # the key off: verl's own sample trains B without the row that raised
    assert stock_kept == ["A", "B", "C"] and stock_rows["B"] == N - 1, (stock_kept, stock_rows)
    assert "rollout/failed_groups" not in stock_metrics
    print(f"B (1 of {N} rows raised) dropped, A and C kept whole; without the key B trains {stock_rows['B']} row")


# Carry-over (verl 0.9.1): the third test.
CARRY_TOLERANCE = 1e-4  # nats
CARRY_LONG = 6 * RESPONSE_LENGTH  # a slow row: room for verl's per-row overhead of the kept group (prompt + 768 < 1024)
CARRY_GROUPS = {  # group -> (loop, prompt); dispatched at the step of the comment
    "A": ("entropy_single_turn_agent", "A: say something short"),  # step 1, kept
    "C": ("fixed_length_agent", f"C: tokens={CARRY_LONG}"),  # step 1, carried, kept at step 2 under new weights
    "E": ("entropy_single_turn_agent", "E: say something short"),  # step 3, kept
    "D": (
        "fixed_length_agent",
        f"D: tokens={CARRY_LONG}",
    ),  # step 3, carried, still running at step 4: too stale, dropped
    "F": ("entropy_single_turn_agent", "F: say something short"),  # step 4, kept
}


def _wait_until_decoding(address: str, requests: int, tokens: int) -> None:
    """Until ``requests`` requests run on the sglang server at ``address`` alone and have decoded about ``tokens``
    tokens each since first seen (its KV tokens in use grew by ``requests * tokens``; sglang's ``/get_load``)."""
    import json
    import urllib.request

    first = None
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{address}/get_load", timeout=30) as reply:
            [load] = json.loads(reply.read())
        if load["num_reqs"] - load["num_waiting_reqs"] == requests:
            used = load["num_tokens"] - load["num_pending_tokens"]
            first = used if first is None else first
            if used - first >= requests * tokens:
                return
        time.sleep(0.02)
    raise AssertionError(f"{requests} requests did not decode {tokens} tokens each in {WAIT_S} s")


class _Trainer:
    """The attributes verl 0.9.1's sync trainer hooks read (``trainer_sync.py``, ``trainer_base.py prepare_step``),
    over the real servers; the seams under test are the real wrapped methods, called on this object. A dispatch
    takes the next of ``next_groups``, each a key of ``plans`` (group -> (loop, prompt)), with ``rollout_n`` rows
    each (``None``: ``rollout.n``)."""

    def __init__(self, config, servers, replica, buffer, manager, weights, plans=None, rollout_n=None):
        from types import SimpleNamespace

        self.config, self.llm_server_manager, self.replay_buffer = config, servers, buffer
        self.global_steps, self.timing_raw, self.curr_step_profile = 0, {}, False
        self.calls: list[str] = []
        self.dispatched: dict[str, str] = {}  # group -> uid
        self._manager, self._weights, self._replica = manager, weights, replica
        self.checkpoint_manager = SimpleNamespace(
            abort_replicas=lambda: self._replica_call("abort_all_requests"),
            resume_generation_replicas=lambda: self._replica_call("resume_generation"),
            # a weight sync: the next weights from disk, into the paused server (verl's naive engine writes tensors)
            update_weights=lambda global_steps: self._update(global_steps),
            # on CPU the sleep would free nothing (no memory saver); what counts is that the servers are idle then
            sleep_replicas=lambda: self.calls.append("sleep"),
        )
        self.next_groups: list[str] = []
        self.plans, self.rollout_n = plans or CARRY_GROUPS, rollout_n

    def _replica_call(self, name: str) -> None:
        import asyncio

        self.calls.append(name)
        asyncio.run(getattr(self._replica, name)())

    def _update(self, global_steps: int) -> None:
        self.calls.append("update_weights")
        if global_steps in self._weights:
            load_weights(self.llm_server_manager.server_addresses[0], self._weights[global_steps])

    def _add_batch_to_generate(self) -> None:  # verl's: one train_batch_size of prompts
        self._add_prompts_to_generate(self.config.data.train_batch_size)

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        groups, self.next_groups = self.next_groups[:num_prompts], self.next_groups[num_prompts:]
        assert len(groups) == num_prompts, f"asked for {num_prompts} prompts, the test planned {groups}"
        names, contents = zip(*(self.plans[g] for g in groups), strict=True)
        uids = _dispatch(self._manager, list(names), list(contents), self.global_steps, self.rollout_n)
        self.dispatched.update(zip(groups, uids, strict=True))
        return num_prompts


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_v1_carry_over_resumes_a_group_under_new_weights_and_drops_a_stale_one(tiny_model_dir, tmp_path, monkeypatch):
    """Carry-over on verl 0.9.1 through the real rollout path (real Ray, our replica on a real sglang 0.5.12 CPU
    Engine, the block's manager with its resuming client, real TransferQueue, our buffer) and the real trainer seams
    (``trainer_seams.py``: ``prepare_step``, ``on_init_end``, ``on_sample_end``, ``on_step_end`` of verl's classes,
    called on :class:`_Trainer`). ``rollout.n = 2``, ``over_sample_rate = 0.5``, ``max_staleness = 1``; fast groups
    run the single-turn loop on the short-turn model, slow ones the fixed-length loop to :data:`CARRY_LONG` tokens.

    1. step 1 (weights W1, version 0): A, C dispatched (2 fresh prompts); A kept; C is left running (carried), then
       paused before verl's sleep: its rows come back cut, their client waits;
    2. the step's end: the server loads W2 (version 1), is told so, and resumes: C's rows go on;
    3. step 2: no fresh prompt (``train_batch_size`` 1 - 1 carried); C kept: each row's tokens are its parts (W1's
       then W2's, by ``token_global_steps``), each token's rollout log-prob and entropy equal an HF recomputation
       under the weights that sampled it (1e-4), and not under the other weights;
    4. step 3: E, D dispatched; E kept, D carried; step 4: F dispatched, F kept; D, still running, would train at
       step 5 with tokens of version 2 (staleness 2 > 1): aborted by session, its rows cut, removed with its tokens
       counted; no session is left on the server.
    """
    import transfer_queue as tq
    from transformers import AutoModelForCausalLM
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    import treetune_verl.verl.process_setup  # noqa: F401  (external_lib: what verl imports in the trainer's process)
    from treetune_verl.batch_keys import TOKEN_GLOBAL_STEPS_KEY
    from treetune_verl.trainer.features import RunFeatures
    from treetune_verl.verl.v0_9_1 import trainer_seams

    w1 = model_with_short_turns(tiny_model_dir, tmp_path / "w1")
    w2 = other_weights(w1, tmp_path / "w2")
    overrides = [
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.over_sample_rate=0.5",
        "+actor_rollout_ref.rollout.custom.over_sample.carry_over=true",
        "+actor_rollout_ref.rollout.custom.over_sample.max_staleness=1",
        "algorithm.rollout_correction.rollout_is=token",
        "data.gen_batch_size=1",
        f"{SAMPLER_KEY}.path={SAMPLER_PATH}",
        f"{SAMPLER_KEY}.name={SAMPLER_NAME}",
    ]
    config = _config(w1, tmp_path / "cfg", loops=[FIXED_LENGTH_LOOP], overrides=overrides, response_length=CARRY_LONG)
    trainer_seams.install(RunFeatures.from_config(config, rollout_entropy=True))
    monkeypatch.setenv("TRANSFER_QUEUE_ENABLE", "1")

    def step(trainer, global_steps, groups, batch_size, decoding=False):
        """One training step as verl's sync trainer runs it, up to the end of sampling; the batch's groups. With
        ``decoding``, sampling ends once the group left running decodes (see below)."""
        trainer.global_steps, trainer.next_groups = global_steps, list(groups)
        with open_dict(trainer.config):
            trainer.config.data.train_batch_size = batch_size
        PPOTrainer.prepare_step(trainer)
        assert not trainer.next_groups, f"step {global_steps}: {trainer.next_groups} not dispatched"
        batch, metrics = buffer.sample(global_steps=global_steps, partition_id="train", batch_size=batch_size)
        if decoding:
            # the test needs tokens of the carried group under these weights when the step ends: its worker may start
            # it only after the kept group has finished (a first version saw 0 tokens once, 17 another time)
            _wait_until_decoding(servers.server_addresses[0], requests=N, tokens=8)
        PPOTrainerSync.on_sample_end(trainer)
        kept = sorted({g for g, uid in trainer.dispatched.items() for key in batch.keys if key.startswith(uid)})
        return batch, metrics, kept

    rows = {}
    with _v1_rollout(config, monkeypatch) as (session, servers, replica, manager):
        buffer = _sync_buffer()
        trainer = _Trainer(config, servers, replica, buffer, manager, weights={1: w2})
        PPOTrainerSync.on_init_end(trainer)  # verl's first sync, then the servers' weight version 0

        batch1, metrics1, kept1 = step(trainer, 1, "AC", batch_size=2, decoding=True)
        assert kept1 == ["A"] and buffer.carried == 1, (kept1, buffer.carried)
        assert trainer.calls[-2:] == ["abort_all_requests", "sleep"], trainer.calls  # paused before verl's sleep
        tq.kv_clear(partition_id="train", keys=batch1.keys)
        PPOTrainerSync.on_step_end(trainer)  # W2, version 1, resume
        assert trainer.calls[-2:] == ["update_weights", "resume_generation"], trainer.calls

        batch2, metrics2, kept2 = step(trainer, 2, "", batch_size=1)  # the carried group fills the batch
        assert kept2 == ["C"], kept2
        fields = ["prompts", "responses", "rollout_log_probs", "extra_fields"]
        data = tq.kv_batch_get(keys=batch2.keys, partition_id="train", select_fields=fields)
        extra_fields = data.pop("extra_fields").tolist()  # as verl reads it (trainer_base.py _compute_metrics)
        rows = {
            key: (p.tolist(), r.tolist(), lp.double(), extra)
            for key, p, r, lp, extra in zip(
                batch2.keys,
                data["prompts"].unbind(0),
                data["responses"].unbind(0),
                data["rollout_log_probs"].unbind(0),
                extra_fields,
                strict=True,
            )
        }
        tq.kv_clear(partition_id="train", keys=batch2.keys)
        PPOTrainerSync.on_step_end(trainer)

        batch3, _, kept3 = step(trainer, 3, "ED", batch_size=2)
        assert kept3 == ["E"] and buffer.carried == 1, (kept3, buffer.carried)
        tq.kv_clear(partition_id="train", keys=batch3.keys)
        PPOTrainerSync.on_step_end(trainer)
        batch4, metrics4, kept4 = step(trainer, 4, "F", batch_size=2)  # 2 - 1 carried = 1 fresh prompt
        assert kept4 == ["F"] and buffer.carried == 0, (kept4, buffer.carried)
        listed = tq.kv_list(partition_id="train").get("train", {})
        assert not any(key.startswith(trainer.dispatched["D"]) for key in listed), "D not removed"
        assert ray.get([s.aborted_session_count.remote() for s in servers.server_handles]) == [0]
        tq.kv_clear(partition_id="train", keys=batch4.keys)
        PPOTrainerSync.on_step_end(trainer)
    trainer_seams.install(RunFeatures())  # the process's later tests run without carry-over
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    # step 1: C carried (nothing dropped); step 2: C resumed, its tokens of version 0 trained a step late
    assert metrics1["rollout/carry_over/groups_carried"] == 1 and metrics1["rollout/aborted_groups"] == 0
    assert metrics2["rollout/carry_over/groups_resumed"] == 1
    # step 4: D dropped, its rows cut before CARRY_LONG and their tokens counted
    assert metrics4["rollout/aborted_groups"] == 1 and metrics4["rollout/aborted_rows"] == N
    assert 0 < metrics4["rollout/aborted_tokens"] < N * CARRY_LONG, metrics4

    hf1 = AutoModelForCausalLM.from_pretrained(w1, torch_dtype=torch.float32).eval()
    hf2 = AutoModelForCausalLM.from_pretrained(w2, torch_dtype=torch.float32).eval()
    errors, wrong, carried_tokens = [], [], 0
    for key, (prompt, response, logp, extra) in rows.items():
        steps = extra[TOKEN_GLOBAL_STEPS_KEY]
        k = steps.count(0)
        assert len(response) == CARRY_LONG == len(steps), f"{key}: {len(response)} tokens, {len(steps)} versions"
        assert steps == [0] * k + [1] * (CARRY_LONG - k) and 0 < k < CARRY_LONG, (
            f"{key}: not cut mid-way: {k} tokens of W1"
        )
        entropy = torch.tensor(extra["response_entropy"], dtype=torch.float64)
        ent1, logp1 = teacher_forced(hf1, prompt, response)
        ent2, logp2 = teacher_forced(hf2, prompt, response)
        expected_logp, expected_entropy = torch.cat([logp1[:k], logp2[k:]]), torch.cat([ent1[:k], ent2[k:]])
        errors.append(max((logp - expected_logp).abs().max().item(), (entropy - expected_entropy).abs().max().item()))
        # the test can fail: each part under the other part's weights is far off
        wrong += [(logp[:k] - logp2[:k]).abs().max().item(), (logp[k:] - logp1[k:]).abs().max().item()]
        carried_tokens += k
    assert max(errors) <= CARRY_TOLERANCE, f"resumed rows differ from HF under their own weights by {max(errors):.3g}"
    assert min(wrong) > 100 * CARRY_TOLERANCE, f"the other weights would pass too: {wrong}"
    assert metrics2["rollout/carry_over/staleness/1"] == carried_tokens == metrics2["rollout/carry_over/tokens_trained"]
    print(
        f"C's rows: {[extra[TOKEN_GLOBAL_STEPS_KEY].count(0) for *_, extra in rows.values()]} of {CARRY_LONG} tokens from "
        f"W1; max |resumed - HF own weights| {max(errors):.2e}, other weights >= {min(wrong):.2e}; D dropped with "
        f"{metrics4['rollout/aborted_tokens']} tokens"
    )
