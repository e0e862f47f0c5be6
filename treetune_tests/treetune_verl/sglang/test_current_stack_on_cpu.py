# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sglang 0.5.12 adapter on the real installed sglang classes (no Engine: ``test_entropy_engine_on_cpu`` runs
the whole path).

- The plugin seam: our entry point is registered; sglang's own ``load_plugins()`` in a fresh interpreter applies our
  hooks only with ``TREETUNE_ENTROPY=1``; ``install()`` refuses a ``SGLANG_PLUGINS`` that would leave the scheduler
  without them.
- ``StepEntropy``: the values of the step's tensor, copied to the host once.
- ``_handle_batch_output``'s hook on real ``BatchStrOutput`` objects: our list moves into ``output_token_entropy_val``,
  other ``customized_info`` keys stay; a list that does not have one entry per row is refused, not shifted.
- Incremental streaming slices our key; ``ServerArgs.check_server_args`` runs our refusals.

Runs in the current stack's environment only (``make test STACK=current``); skipped on sglang 0.5.6.post2.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points, version

import pytest

pytestmark = pytest.mark.skipif(version("sglang") != "0.5.12", reason="the sglang 0.5.12 adapter")

_LOADED_BY_SGLANG = """
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.layers.sampler import Sampler
from sglang.srt.managers.scheduler import Scheduler
from treetune_verl.patching import is_patched
print(is_patched(Sampler, "forward"), is_patched(Scheduler, "get_internal_state"))
"""


@pytest.fixture
def pristine(monkeypatch):
    """Every 0.5.12 target as upstream has it (restored after the test) and no entropy variable set."""
    from sglang.srt.layers.sampler import Sampler
    from sglang.srt.managers import tokenizer_manager as tm
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs

    from treetune_verl.patching import original_of
    from treetune_verl.sglang.config import ENV_ENABLED, ENV_MODE, ENV_TOP_K

    targets = [
        (Sampler, "forward"),
        (Scheduler, "get_internal_state"),
        (tm.TokenizerManager, "_handle_batch_output"),
        (tm.TokenizerManager, "convert_logprob_style"),
        (tm.TokenizerManager, "add_logprob_to_meta_info"),
        (ServerArgs, "check_server_args"),
    ]
    for owner, name in targets:
        monkeypatch.setattr(owner, name, original_of(getattr(owner, name)))
    keys = tuple(k for k in tm._INCREMENTAL_STREAMING_META_INFO_KEYS if k != "output_token_entropy")
    monkeypatch.setattr(tm, "_INCREMENTAL_STREAMING_META_INFO_KEYS", keys)
    for var in (ENV_ENABLED, ENV_TOP_K, ENV_MODE, "SGLANG_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


def test_entry_point_is_registered():
    from treetune_verl.sglang.v0_5_12.launch import PLUGIN_GROUP, PLUGIN_NAME

    (ep,) = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    assert ep.value == "treetune_verl.sglang.plugin:load"


@pytest.mark.parametrize("enabled", [False, True])
def test_sglang_load_plugins_applies_our_hooks_only_when_switched_on(enabled):
    """sglang's own loader, in a fresh interpreter as a spawned scheduler is: inert without ``TREETUNE_ENTROPY=1``."""
    env = {k: v for k, v in os.environ.items() if k not in ("TREETUNE_ENTROPY", "SGLANG_PLUGINS")}
    if enabled:
        env["TREETUNE_ENTROPY"] = "1"
    out = subprocess.run([sys.executable, "-c", _LOADED_BY_SGLANG], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(enabled)] * 2


def test_install_refuses_a_plugin_allow_list_without_ours(pristine, monkeypatch):
    from treetune_verl.sglang.engine import install
    from treetune_verl.sglang.patching import UnsupportedSGLangError, is_patched

    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    with pytest.raises(UnsupportedSGLangError, match="SGLANG_PLUGINS='someone_else' excludes the plugin 'treetune"):
        install()
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    assert not is_patched(TokenizerManager, "_handle_batch_output")  # refused before anything was patched
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else, treetune_entropy")
    install(top_k=5)
    assert is_patched(TokenizerManager, "_handle_batch_output")
    assert os.environ["TREETUNE_ENTROPY"] == "1" and os.environ["TREETUNE_ENTROPY_TOP_K"] == "5"


def test_step_values_are_made_once_at_the_first_read():
    import torch

    from treetune_verl.sglang.v0_5_12.scheduler_hooks import StepValues

    copies = []

    def make():
        copies.append(1)
        return torch.tensor([0.5, 1.25, 2.0]).tolist()

    values = StepValues(make)
    assert values._values is None and not copies  # nothing copied until sglang reads a row
    assert [values[i] for i in range(3)] == [0.5, 1.25, 2.0] and len(values) == 3
    assert len(copies) == 1 and values._make is None  # one copy; the device tensors released after it


def _batch_output(rids: list[str], customized_info: dict):
    from sglang.srt.managers.io_struct import BatchStrOutput

    n = len(rids)
    fields = {name: [None] * n for name in BatchStrOutput.__dataclass_fields__ if name not in ("rids",)}
    fields.update(rids=rids, customized_info=customized_info, output_token_entropy_val=None)
    return BatchStrOutput(**fields)


def test_handle_batch_output_moves_our_values_and_keeps_other_keys():
    from treetune_verl.sglang.v0_5_12.scheduler_hooks import CUSTOMIZED_INFO_KEY
    from treetune_verl.sglang.v0_5_12.tokenizer_hooks import move_entropy_out_of_customized_info

    out = _batch_output(["a", "b"], {CUSTOMIZED_INFO_KEY: [[0.1, 0.2], [0.3]], "other": [1, 2]})
    move_entropy_out_of_customized_info(out)
    assert out.output_token_entropy_val == [[0.1, 0.2], [0.3]]
    assert out.customized_info == {"other": [1, 2]}


def test_handle_batch_output_refuses_lists_not_one_per_row(caplog):
    from treetune_verl.sglang.v0_5_12.scheduler_hooks import CUSTOMIZED_INFO_KEY
    from treetune_verl.sglang.v0_5_12.tokenizer_hooks import move_entropy_out_of_customized_info

    out = _batch_output(["a", "b", "c"], {CUSTOMIZED_INFO_KEY: [[0.1], [0.3]]})
    with caplog.at_level(logging.ERROR):
        move_entropy_out_of_customized_info(out)
    assert out.output_token_entropy_val == [None, None, None]  # no row gets another row's values
    assert "2 entropy lists for 3 requests" in caplog.text


def test_incremental_streaming_slices_our_key(pristine):
    from sglang.srt.managers import tokenizer_manager as tm

    from treetune_verl.sglang.v0_5_12.tokenizer_hooks import apply_tokenizer_hooks

    apply_tokenizer_hooks()
    apply_tokenizer_hooks()  # idempotent
    assert tm._INCREMENTAL_STREAMING_META_INFO_KEYS.count("output_token_entropy") == 1
    meta = {"output_token_logprobs": [1, 2, 3], "output_token_entropy": [0.1, 0.2, 0.3]}
    tm._slice_streaming_output_meta_info(meta, 2)  # sglang's own slicing of a chunk
    assert meta == {"output_token_logprobs": [3], "output_token_entropy": [0.3]}


def test_streaming_keys_of_another_shape_are_refused_before_any_hook(pristine, monkeypatch):
    """The key tuple is a ``Replace``: sglang's value is checked before anything is set, as a wrap's signature is."""
    from sglang.srt.managers import tokenizer_manager as tm

    from treetune_verl.sglang.patching import UnsupportedSGLangError, is_patched
    from treetune_verl.sglang.v0_5_12.tokenizer_hooks import apply_tokenizer_hooks

    monkeypatch.setattr(tm, "_INCREMENTAL_STREAMING_META_INFO_KEYS", ["output_token_logprobs"])
    with pytest.raises(UnsupportedSGLangError, match=r"_INCREMENTAL_STREAMING_META_INFO_KEYS: is \['output_token"):
        apply_tokenizer_hooks()
    assert tm._INCREMENTAL_STREAMING_META_INFO_KEYS == ["output_token_logprobs"]
    assert not is_patched(tm.TokenizerManager, "_handle_batch_output")  # checked first: nothing else patched


def test_check_server_args_runs_our_refusals(pristine, tiny_model_dir):
    from sglang.srt.server_args import ServerArgs

    from treetune_verl.sglang.engine import engine_kwargs
    from treetune_verl.sglang.patching import UnsupportedSGLangError
    from treetune_verl.sglang.v0_5_12.tokenizer_hooks import apply_tokenizer_hooks

    args = ServerArgs(**engine_kwargs(str(tiny_model_dir), "cpu"))
    args.check_server_args()  # upstream accepts the CPU settings
    apply_tokenizer_hooks()
    args.check_server_args()  # and so do we
    args.disaggregation_mode = "prefill"
    with pytest.raises(UnsupportedSGLangError, match="disaggregated prefill/decode"):
        args.check_server_args()
