# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Carry-over on verl 0.9.1 keeps its carried groups across a checkpoint: verl's real ``_submit_batch_to_rollout``,
``_save_checkpoint``, ``_load_checkpoint`` and ``_reissue_inflight_prompts``, wrapped by our seams
(``trainer_seams.py``), on real Ray and a real TransferQueue, saved and restored across a restart of TransferQueue.

A step is paused when verl saves (``fit`` saves before ``on_step_end`` resumes the servers): a carried group that
finished while the step ended (X) is in TransferQueue with its rows, one still running (Y) with the rows it finished.
After the restart X is sampleable as it was, Y is re-issued from its prompt's data (its old rows cleared, every row
sampled again), and the buffer counts both as carried, so the next step dispatches ``train_batch_size - 2`` fresh
prompts. Without carry-over the seams leave verl's sync branch alone: no prompt data, no TransferQueue in the
checkpoint (the test can fail). The actor worker group, the dataloader and the agent-loop manager are stand-ins that
record the calls (they need GPUs and a dataset; the rollout path is ``test_v1_rollout_standalone_on_cpu.py``).
"""

from __future__ import annotations

import importlib.metadata
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import open_dict

from treetune_tests.treetune_verl.agent_loop.standalone import (
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    driver_state_restored,  # noqa: F401  (fixture, used below)
    ray_session,
)
from treetune_tests.treetune_verl.verl_config import compose_ppo_trainer

pytestmark = [
    pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)"),
    pytest.mark.usefixtures("driver_state_restored"),
]

TRAIN = "train"
N = 2  # rows per group


class _Recorder:
    """A stand-in that records each call of any method: ``calls`` = [(name, args, kwargs)]."""

    def __init__(self, **returns):
        self.calls, self._returns = [], returns

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self._returns.get(name)

        return call


class _Trainer:
    """The attributes verl 0.9.1's checkpoint methods and dispatch read (``trainer_base.py``)."""

    def __init__(self, config):
        self.config, self.trainer_mode, self.global_steps, self.use_critic = config, "sync", 0, False
        self.actor_rollout_wg, self.checkpoint_callback = _Recorder(), _Recorder()
        self.train_dataloader = _Recorder(state_dict={"fetched": 4})
        self.agent_loop_manager = _Recorder()
        self.replay_buffer = SimpleNamespace(carried=0)
        self._restored_tq_prompt_count = 0


def _prompts(names: list[str], global_steps: int):
    from verl.utils import tensordict_utils as tu

    raw_prompt = np.empty(len(names), dtype=object)
    raw_prompt[:] = [[{"role": "user", "content": name}] for name in names]
    batch = tu.get_tensordict(
        {
            "raw_prompt": raw_prompt,
            "index": torch.arange(len(names)),
            "uid": np.array([str(uuid.uuid4()) for _ in names], dtype=object),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", global_steps)
    return batch


def _finish_rows(uid: str, rows: range, global_steps: int) -> None:
    """What an agent-loop worker puts for finished rows (``agent_loop_tq.py``): their fields and tags."""
    import transfer_queue as tq
    from verl.utils import tensordict_utils as tu

    keys = [f"{uid}_{s}_0" for s in rows]
    fields = tu.get_tensordict({"responses": torch.arange(3 * len(keys)).reshape(len(keys), 3)})
    tags = [{"status": "success", "response_len": 3, "global_steps": global_steps} for _ in keys]
    tq.kv_batch_put(keys=keys, partition_id=TRAIN, fields=fields, tags=tags)


def _run(config, tmp_path, carry_over: bool) -> dict:
    """Dispatch X, Y at step 1; X finishes, Y is half done; save; restart TransferQueue; load; re-issue."""
    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from treetune_verl.trainer.features import RunFeatures
    from treetune_verl.verl.v0_9_1 import trainer_seams

    trainer_seams.install(RunFeatures(rollout_entropy=True, over_sample_rate=0.5, carry_over=carry_over))
    with open_dict(config):
        config.trainer.default_local_dir = str(tmp_path / "checkpoints")
    trainer = _Trainer(config)
    trainer.global_steps = 1
    batch = _prompts(["X", "Y"], global_steps=1)
    x, y = batch["uid"]
    PPOTrainer._submit_batch_to_rollout(trainer, batch)
    _finish_rows(x, range(N), 1)
    tq.kv_put(key=x, partition_id=TRAIN, tag={"status": "finished"})
    _finish_rows(y, range(1), 1)
    tq.kv_put(key=y, partition_id=TRAIN, tag={"status": "running"})
    PPOTrainer._save_checkpoint(trainer)

    tq.close()  # a new run: an empty TransferQueue
    tq.init(config.transfer_queue)
    assert not tq.kv_list(partition_id=TRAIN).get(TRAIN)
    resumed = _Trainer(config)
    PPOTrainer._load_checkpoint(resumed)
    resumed.global_steps += 1  # fit's first step
    reissued = PPOTrainer._reissue_inflight_prompts(resumed)
    listed = tq.kv_list(partition_id=TRAIN).get(TRAIN, {})
    trainer_seams.install(RunFeatures())
    return {
        "x": x,
        "y": y,
        "global_steps": resumed.global_steps,
        "carried": resumed.replay_buffer.carried,
        "reissued": reissued,
        "dispatched": [args[0] for name, args, _ in resumed.agent_loop_manager.calls if name == "generate_sequences"],
        "listed": listed,
        "saved_queue": (tmp_path / "checkpoints" / "global_step_1" / "transfer_queue").exists(),
    }


@pytest.mark.slow
def test_carried_groups_survive_a_checkpoint_and_the_running_one_is_reissued(tiny_model_dir, tmp_path, monkeypatch):
    import transfer_queue as tq

    config = compose_ppo_trainer(
        tiny_model_dir,
        PROMPT_LENGTH,
        RESPONSE_LENGTH,
        ["transfer_queue.backend.SimpleStorage.num_data_storage_units=1"],
    )
    monkeypatch.setenv("TRANSFER_QUEUE_ENABLE", "1")
    with ray_session(monkeypatch):
        tq.init(config.transfer_queue)
        try:
            carried = _run(config, tmp_path / "carry", carry_over=True)
            tq.close()
            tq.init(config.transfer_queue)
            stock = _run(config, tmp_path / "stock", carry_over=False)
        finally:
            tq.close()

    x, y, listed = carried["x"], carried["y"], carried["listed"]
    assert carried["saved_queue"] and carried["global_steps"] == 2
    assert carried["carried"] == 2  # X and Y take slots of the next step's batch
    assert listed[x]["status"] == "finished" and all(f"{x}_{s}_0" in listed for s in range(N))
    assert carried["reissued"] == 1 and listed[y]["status"] == "pending" and listed[y]["global_steps"] == 2
    assert not any(key.startswith(f"{y}_") for key in listed), "Y's old rows not cleared"
    [reissued] = carried["dispatched"]
    assert list(reissued["uid"]) == [y] and reissued["raw_prompt"][0] == [{"role": "user", "content": "Y"}]
    print(
        f"after the restart: X {listed[x]['status']} with {sum(k.startswith(f'{x}_') for k in listed)} rows, Y "
        f"re-issued at step {listed[y]['global_steps']}, {carried['carried']} groups carried; without carry-over "
        f"TransferQueue kept {len(stock['listed'])} keys"
    )
    # verl's sync branch: the carried groups would be lost with the restart
    assert not stock["saved_queue"] and stock["carried"] == 0 and stock["reissued"] == 0 and not stock["listed"]
