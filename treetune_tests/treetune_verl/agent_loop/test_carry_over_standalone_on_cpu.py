# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Over-sampling with carry-over through the real rollout path and the real trainer seam: real Ray, our manager in
verl's standalone mode, a real sglang CPU Engine behind ``EntropySGLangHttpServer``, two real workers; each step's
batch goes through verl 0.7.1's own ``RayPPOTrainer._get_gen_batch`` as our seam wraps it, as ``fit`` calls it.

Groups of 2 rows (``rollout.n = 2``, their ``uid``), ``over_sample_rate = 0.5`` (4 groups, 2 kept), ``max_staleness
= 1``, the model of the standalone tests (turns end after a few tokens) and ``fixed_length_agent`` rows that ignore
end-of-sequence (only their sampling differs):

1. step 1, weights W1: groups A, B (a quarter of the budget), C (one long row, one of a single token:
   ``lengths=N/1``) and D (two long): A, B kept, C and D aborted and carried: C's short row finished, the long rows
   cut with their partial tokens;
2. the server loads other weights W2 (``/update_weights_from_disk``, as a weight sync would);
3. step 2: C and D take the first two slots of the batch, two fresh groups E, F (long rows) the others, G and H wait
   in the backlog; the cut rows continue with their own request's sampling parameters (EOS ignored, to exactly
   ``RESPONSE_LENGTH`` tokens in all), so they need a quarter of the budget fewer tokens than E's and F's rows and
   C, D are kept (the engine decodes the running requests in lockstep): each row's tokens are its parts
   concatenated, each token's rollout log-prob and entropy equal an HF recomputation under the weights that sampled
   it (W1 for the carried part, W2 for the rest: 1e-4), and not under the other weights; ``rollout_resumed_tokens``
   counts the carried part; E, F are carried;
4. step 4 (the policy moved twice since E, F were cut: staleness 2 > 1): E and F restart from scratch (their
   tokens discarded and counted), G, H come out of the backlog, the new prompts wait.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from omegaconf import open_dict

from treetune_tests.treetune_verl.agent_loop.fakes import FIXED_LENGTH_LOOP, make_batch, unpadded
from treetune_tests.treetune_verl.agent_loop.standalone import (
    RESPONSE_LENGTH,
    driver_state_restored,  # noqa: F401  (fixture, used below)
    load_weights,
    model_with_short_turns,
    other_weights,
    ray_session,
    standalone_config,
    teacher_forced,
)
from treetune_verl.agent_loop.carry_over import BoundedLoader
from treetune_verl.batch_keys import PENDING_METRICS_KEY, ROLLOUT_ABORTED_KEY, ROLLOUT_RESUMED_TOKENS_KEY
from treetune_verl.config import AGENT_LOOPS_YAML
from treetune_verl.verl import EntropyAgentLoopManager

pytest.importorskip("uvicorn", reason="sglang's http_server (imported by verl's server) needs uvicorn")
pytest.importorskip("multipart", reason="sglang's http_server needs python-multipart")
pytestmark = pytest.mark.usefixtures("driver_state_restored")

N = 2  # rows per group
LONG = f"tokens={RESPONSE_LENGTH}"
# A's and B's rows at step 1: the long rows have at least this many tokens when they are cut, so at step 2 the carried
# rows need at least RESPONSE_LENGTH // 4 decode steps fewer than the fresh ones (a margin no scheduling delay of a
# loaded CI machine has crossed; with short turns it was a few tokens, and E once finished before D), and still at
# least 3/4 of the budget left before the cut (the abort comes long before they could finish)
HEAD_START = f"tokens={RESPONSE_LENGTH // 4}"
PROMPTS = {  # group -> (agent loop, plan) of its rows (the rows of a group share its prompt)
    "A": ("fixed_length_agent", f"a {HEAD_START}"),
    "B": ("fixed_length_agent", f"b {HEAD_START}"),
    "C": ("fixed_length_agent", f"c lengths={RESPONSE_LENGTH}/1"),  # one long row, one of a single token
    "D": ("fixed_length_agent", f"d {LONG}"),
    "E": ("fixed_length_agent", f"e {LONG}"),
    "F": ("fixed_length_agent", f"f {LONG}"),
    **{g: ("entropy_single_turn_agent", f"short {g.lower()}") for g in "GHIJKL"},
}
TOLERANCE = 1e-4  # nats


def _trainer_prompts(uids: list[str], plans: list[str], agent_names: list[str] | None = None):
    """The dataloader's prompts as ``fit`` holds them before ``_get_gen_batch``: the agent-loop input of
    ``fakes.make_batch`` (``fixed_length_agent`` unless ``agent_names`` says otherwise) with ``uid``, a data source and
    the tensor verl's ``RLHFDataset`` adds."""
    from tensordict import TensorDict

    count = len(uids)
    batch = make_batch(plans, agent_names or ["fixed_length_agent"] * count)
    batch.batch = TensorDict({"dummy_tensor": torch.zeros(count, 1, dtype=torch.uint8)}, batch_size=(count,))
    batch.non_tensor_batch["data_source"] = np.array(["carry"] * count, dtype=object)
    batch.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    batch.meta_info = {"temperature": 1.0}
    return batch


def _generate(manager, trainer, groups: str, global_steps: int):
    """One training step's generation as ``fit`` runs it: the seam-wrapped ``_get_gen_batch``, ``rollout.n``
    interleaved copies, the manager."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    trainer.global_steps = global_steps
    batch = _trainer_prompts(list(groups), [PROMPTS[g][1] for g in groups], [PROMPTS[g][0] for g in groups])
    gen_batch = RayPPOTrainer._get_gen_batch(trainer, batch)  # our seam, then verl's own
    gen_batch.meta_info["global_steps"] = global_steps
    out = manager.generate_sequences(gen_batch.repeat(repeat_times=N, interleave=True))
    return list(batch.non_tensor_batch["uid"]), out


def _carry_config(model_path, workdir):
    loops = yaml.safe_load(Path(AGENT_LOOPS_YAML).read_text()) + [FIXED_LENGTH_LOOP]
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "loops.yaml").write_text(yaml.safe_dump(loops))
    config = standalone_config(model_path, workdir)
    with open_dict(config):
        rollout = config.actor_rollout_ref.rollout
        rollout.n = N
        rollout.over_sample_rate = 0.5
        rollout.custom.over_sample = {"carry_over": True, "max_staleness": 1}
        config.data.train_batch_size = 4  # the dataloader's batch: a step's groups (the carry-over buffer's slots)
        rollout.agent.agent_loop_config_path = str(workdir / "loops.yaml")
        config.algorithm.adv_estimator = "grpo"
        config.algorithm.rollout_correction.rollout_is = "token"
        config.actor_rollout_ref.model.external_lib = "treetune_verl.verl.process_setup"
    return config


def _rows_of(uids: list[str], group: str) -> list[int]:
    """Positions of ``group``'s rows in the repeated (interleaved) batch."""
    first = uids.index(group) * N
    return list(range(first, first + N))


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant (declared GPU, CPU engine settings)")
def test_carried_rows_resume_under_new_weights_with_each_tokens_own_log_prob(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    w1 = model_with_short_turns(tiny_model_dir, tmp_path / "w1")
    w2 = other_weights(w1, tmp_path / "w2")
    config = _carry_config(w1, tmp_path / "cfg")
    with ray_session(monkeypatch) as session:
        manager = EntropyAgentLoopManager.create(config)
        [replica] = manager.rollout_replicas
        session.track(*replica.workers, *replica.servers, *manager.agent_loop_workers)
        carry = manager.carry_over
        # the dataloader as verl's fit sees it through our fit seam (the batches below are handed in directly)
        trainer = SimpleNamespace(
            async_rollout_manager=manager, global_steps=0, train_dataloader=BoundedLoader([], carry)
        )

        uids1, out1 = _generate(manager, trainer, "ABCD", global_steps=1)
        carried = {g: carry.carried(g) for g in "ABCD"}
        backlog1 = carry.backlog
        load_weights(manager.server_addresses[0], w2)
        uids2, out2 = _generate(manager, trainer, "EFGH", global_steps=2)
        carried2 = {g: carry.carried(g) for g in "EF"}
        backlog2 = carry.backlog
        uids3, out3 = _generate(manager, trainer, "IJKL", global_steps=4)
        backlog3 = carry.backlog
    assert not session.left, f"processes of the run left after ray.shutdown(): {session.left}"

    # step 1: C and D aborted and carried, their rows' states kept
    assert uids1 == list("ABCD") and backlog1 == 0
    assert out1.batch[ROLLOUT_ABORTED_KEY].nonzero().flatten().tolist() == [4, 5, 6, 7]
    assert carried["A"] is None and carried["B"] is None
    rows = carried["C"] + carried["D"]
    assert all(row is not None and row.resumable and row.token_steps == [1] * len(row) for row in rows)
    assert [row.finished for row in rows] == [False, True, False, False], "C: one cut row, one finished; D: two cut"
    assert all(len(row) > 0 for row in rows), "a long row was cut before its first token"
    metrics1 = out1.meta_info[PENDING_METRICS_KEY]
    assert metrics1["rollout/carry_over/tokens_carried"] == sum(len(row) for row in rows)
    assert metrics1["rollout/carry_over/groups_carried"] == 2
    assert metrics1["rollout/carry_over/tokens_discarded"] == 0

    # step 2: C, D first, then E, F; G, H wait; C and D kept, each row = its carried part + what W2 added
    assert uids2 == list("CDEF") and backlog2 == 2
    aborted2 = out2.batch[ROLLOUT_ABORTED_KEY].nonzero().flatten().tolist()
    assert aborted2 == [4, 5, 6, 7], f"step 2 aborted {aborted2}"
    hf1 = AutoModelForCausalLM.from_pretrained(w1, torch_dtype=torch.float32).eval()
    hf2 = AutoModelForCausalLM.from_pretrained(w2, torch_dtype=torch.float32).eval()
    errors, wrong = [], []
    for row, i in zip(carried["C"] + carried["D"], _rows_of(uids2, "C") + _rows_of(uids2, "D"), strict=True):
        prompt, response, mask, entropy_row = unpadded(out2, i)
        k = len(row)
        assert prompt == row.prompt_ids and response[:k] == row.response_ids, f"row {i}: not its carried part"
        assert int(out2.batch[ROLLOUT_RESUMED_TOKENS_KEY][i]) == k
        if row.finished:
            assert response == row.response_ids, f"row {i}: a finished row changed"
        else:  # continued to its own request's budget, no further
            assert len(response) == RESPONSE_LENGTH, f"row {i}: {k} carried + {len(response) - k} new tokens"
        n = len(response)
        assert mask[:n].all() and not mask[n:].any()
        logp = out2.batch["rollout_log_probs"][i, :n].double()
        entropy = entropy_row[:n].double()
        ent1, logp1 = teacher_forced(hf1, prompt, response)
        ent2, logp2 = teacher_forced(hf2, prompt, response)
        expected_logp = torch.cat([logp1[:k], logp2[k:]])
        expected_entropy = torch.cat([ent1[:k], ent2[k:]])
        errors.append(max((logp - expected_logp).abs().max().item(), (entropy - expected_entropy).abs().max().item()))
        # the test can fail: the tokens of one part under the other part's weights are far off
        if k:
            wrong.append((logp[:k] - logp2[:k]).abs().max().item())
        if n > k:
            wrong.append((logp[k:] - logp1[k:]).abs().max().item())
    assert max(errors) <= TOLERANCE, f"stitched rows differ from HF under their own weights by {max(errors):.3g}"
    assert min(wrong) > 100 * TOLERANCE, f"the other weights would pass too: {wrong}"
    metrics2 = out2.meta_info[PENDING_METRICS_KEY]
    resumed_tokens = sum(len(row) for row in rows)
    assert metrics2["rollout/carry_over/groups_resumed"] == 2
    assert metrics2["rollout/carry_over/rows_trained"] == sum(1 for row in rows if len(row))
    assert metrics2["rollout/carry_over/tokens_trained"] == resumed_tokens
    assert metrics2["rollout/carry_over/staleness/1"] == resumed_tokens
    assert metrics2["rollout/carry_over/backlog"] == 2
    assert all(row is not None and row.token_steps == [2] * len(row) for g in "EF" for row in carried2[g]), (
        "E and F were not carried with their step"
    )

    # step 4: E, F (staleness 2 > max_staleness 1) restart from scratch; G, H leave the backlog; I..L wait
    assert uids3 == list("EFGH") and backlog3 == 4
    stale = [row for g in "EF" for row in carried2[g]]
    metrics3 = out3.meta_info[PENDING_METRICS_KEY]
    assert metrics3["rollout/carry_over/rows_restarted_stale"] == len(stale)
    assert metrics3["rollout/carry_over/tokens_discarded_stale"] == sum(len(row) for row in stale)
    assert not out3.batch[ROLLOUT_RESUMED_TOKENS_KEY].any(), "a stale row was resumed"
    print(
        f"carried rows: {[(len(row), row.finished) for row in rows]}; max |stitched - HF| {max(errors):.2e}, "
        f"under the other weights >= {min(wrong):.2e}; stale rows restarted: {len(stale)}"
    )
