# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Entropy control through verl 0.9.1's real engine-worker actor update, at 1 and 2 gloo ranks: the current stack's
counterpart of ``forecast/test_live_control_on_cpu.py``.

The setting of ``test_engine_forecast_on_cpu.py`` (verl's ``ActorRolloutRefWorker`` built by its own ``init_model``,
FSDP2, AdamW, our actor seam, a plain update first), E the rollout's at every world size. First the forecast update
without ``custom.entropy_control``, then, from the same start, with it: the band's centre 0.02 nats above E's token
entropy at θ (HF forwards here), so the controller must add entropy through the seam's ``attach``. Checked against HF
forwards written in the test (``reference._token_values``) on the weights each update left: on E's held-out half (each
rank's odd prompts) the controlled update's entropy minus the plain update's is the rule's ``c · b`` within 10 %; the
same coefficient on every rank; the metrics reach verl's output as ``control/*``. Where this E leaves ``b``'s sign
unresolved (1 rank), the fallback: no coefficient, and the update's weights are the plain update's bit for bit.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from treetune_tests.treetune_verl.forecast.reference import held_out_half, pooled_token_entropy, token_lists
from treetune_tests.treetune_verl.verl.v0_9_1.test_engine_forecast_on_cpu import (
    CPU_RUNTIME,
    FORECAST,
    _batch,
    _config,
    _free_port,
    _rollout_eval,
)

pytestmark = pytest.mark.skipif(importlib.metadata.version("verl") != "0.9.1", reason="verl 0.9.1 (the current stack)")

RAISE, WIDTH, Z = 0.02, 0.01, 0.5  # z 0.5: this E's halves are 2 prompts (forecast/test_live_control_on_cpu.py)


def _rank(rank: int, world: int, port: int, model_path: str, out_dir: str, target: float | None) -> None:
    from omegaconf import open_dict

    from treetune_tests.treetune_verl.verl.v0_9_1.engine_actor import join_process_group

    join_process_group(rank, world, port)
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker

    import treetune_verl.verl.process_setup  # noqa: F401  (external_lib: installs the actor seam)
    from treetune_tests.treetune_verl.forecast.reference import full_parameters
    from treetune_verl.forecast.live import STATE_ATTR
    from treetune_verl.patching import original_of

    config = _config(model_path, "central_difference")
    if target is not None:
        with open_dict(config):
            config.actor_rollout_ref.rollout.custom = {
                "entropy_forecast": {**FORECAST, "method": "central_difference"},
                "entropy_control": {"target": target, "width": WIDTH, "z": Z, "max_coefficient": 100.0},
            }
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    vocab = worker.actor.model_config.hf_config.vocab_size
    original_of(ActorRolloutRefWorker.update_actor)(worker, _batch(worker, 1, vocab, rank, world))  # AdamW state
    module = worker.actor.engine.module
    before = full_parameters(module)
    output = worker.update_actor(_batch(worker, 2, vocab, rank, world, _rollout_eval(vocab)))
    after = full_parameters(module)
    result = {
        "metrics": tu.get(output, "metrics") if output is not None else None,
        "E": vars(worker)[STATE_ATTR].last_eval,
        "coefficient": getattr(vars(worker)[STATE_ATTR].controller, "previous", None),
    }
    if rank == 0:
        result |= {"before": before, "after": after}
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _ranks(world: int, model_path: str, out: Path, target: float | None) -> list[dict]:
    out.mkdir()
    torch.multiprocessing.spawn(_rank, args=(world, _free_port(), model_path, str(out), target), nprocs=world)
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


def _pooled_entropy(model_path: str, weights: dict, prompts, responses) -> float:
    """E's token entropy pooled over every response token (nats per token) under ``weights``: HF forwards here."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied embeddings
    return pooled_token_entropy(model, prompts, responses)


# Whether this E (4 prompts: halves of 2, or 1 per rank) leaves b's sign unresolved, as measured: at 1 rank
# b = -0.074 ± 2.4, at 2 ranks -0.19 ± 0.89: the fallback both times (the weights must be verl's own). The acting
# path through verl 0.9.1's worker is the e2e smoke's (spec); the acting path against HF references is the pinned
# stack's test (forecast/test_live_control_on_cpu.py). A larger E here is the next step. Two ranks only in the suite
# (the ranks' agreement; one rank adds 55 s to the current suite, the longer one).
@pytest.mark.parametrize(("world", "fallback"), [(2, True)])
def test_the_controlled_engine_update_lands_where_the_rule_put_it(
    tiny_model_dir, tmp_path, monkeypatch, world, fallback
):
    for key, value in CPU_RUNTIME.items():
        monkeypatch.setenv(key, value)
    model_path = str(tiny_model_dir)
    plain = _ranks(world, model_path, tmp_path / "plain", None)
    prompts, responses = token_lists([result["E"] for result in plain])
    h_before = _pooled_entropy(model_path, plain[0]["before"], prompts, responses)
    h_plain = _pooled_entropy(model_path, plain[0]["after"], prompts, responses)
    target = h_before + RAISE
    assert h_plain < target - WIDTH / 2, "the plain update already lands in the band: nothing to control"

    controlled = _ranks(world, model_path, tmp_path / "controlled", target)
    [m] = [result["metrics"] for result in controlled if result["metrics"] is not None][:1]
    c, b, b_se = m["control/coefficient"], m["control/b"], m["control/b_se"]
    assert all(result["coefficient"] == c for result in controlled), "the ranks decided differently"
    assert m["control/H_before"] == pytest.approx(h_before, abs=1e-5)
    if b <= Z * b_se:  # b unresolved on this E (the rule holds the last decided coefficient: none) or negative (0)
        unresolved = abs(b) <= Z * b_se
        assert m["control/fallback"] == unresolved and c == 0, str({k: v for k, v in m.items() if "control/" in k})
        assert all(torch.equal(controlled[0]["after"][n], plain[0]["after"][n]) for n in plain[0]["after"])
        assert fallback, f"b {b:.3g} ± {b_se:.2g} unresolved where this E resolved it before"
        print(f"world {world}: b {b:.4g} ± {b_se:.2g}: the fallback, the weights verl's own bit for bit")
        return
    assert not fallback, f"b {b:.3g} ± {b_se:.2g} resolved where this E left it unresolved before"
    assert m["control/fallback"] == 0 and c > 0 and b > 0, str({k: v for k, v in m.items() if "control/" in k})

    held_prompts, held_responses = held_out_half([result["E"] for result in controlled])
    held_plain = _pooled_entropy(model_path, plain[0]["after"], held_prompts, held_responses)
    held_after = _pooled_entropy(model_path, controlled[0]["after"], held_prompts, held_responses)
    predicted = c * b
    assert m["control/realised_heldout"] == pytest.approx(held_after - held_plain, abs=1e-5)
    assert abs(held_after - held_plain - predicted) <= 0.1 * predicted, (held_after - held_plain, predicted)
    assert m["control/predicted_before"] < m["control/predicted_after"] <= target
    print(
        f"world {world}: H {h_before:.5f} -> plain {h_plain:.5f}; held out: plain {held_plain:.5f} -> controlled "
        f"{held_after:.5f} (c b {predicted:.5f}); c {c:.4g}, b {b:.4g} ± {m['control/b_se']:.2g}, step ratio "
        f"{m['control/entropy_step_ratio']:.3g}"
    )
