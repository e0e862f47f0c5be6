# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``patching``: the guards every sglang patch goes through (pinned version, exact signatures, idempotence).

Against the real sglang 0.5.6.post2 classes in this process: applying the patches twice patches once (the upstream
object stays reachable), a changed upstream signature or an unsupported sglang version is refused *before* anything
is patched, and the messages name what is supported. Reference: identity of the upstream objects, read from sglang's
own classes (``SchedulerOutputProcessorMixin.__dict__``) rather than through the product.
"""

from __future__ import annotations

import pytest
import sglang
from sglang.srt.layers import sampler as sampler_mod
from sglang.srt.managers import scheduler_output_processor_mixin as mixin_mod
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.tokenizer_manager import TokenizerManager

from treetune_tests.treetune_verl.sglang.sglang_objects import (
    ALL_TARGETS,
    SCHEDULER_TARGETS,
    TOKENIZER_TARGETS,
    current,
)
from treetune_verl.sglang import engine as tt_engine
from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import (
    ENV_ALLOW_UNSUPPORTED,
    ORIGINAL_ATTR,
    UnsupportedSGLangError,
    check_sglang_version,
    check_signature,
    is_patched,
    original_of,
    replace_attr,
)
from treetune_verl.sglang.tokenizer_patches import apply_tokenizer_patches
from treetune_verl.sglang.v0_5_6_post2.scheduler_patches import apply_scheduler_patches

SUPPORTED = "0.5.6.post2"


def test_replace_attr_keeps_the_original_and_replaces_once():
    class Owner:
        def method(self):
            return "upstream"

    upstream = Owner.__dict__["method"]
    made: list = []

    def make(original):
        made.append(original)

        def method(self):
            return "wrapped " + original(self)

        return method

    assert not is_patched(Owner, "method") and original_of(upstream) is upstream
    replace_attr(Owner, "method", make)
    assert Owner().method() == "wrapped upstream" and is_patched(Owner, "method")
    assert getattr(Owner.method, ORIGINAL_ATTR) is upstream and original_of(Owner.method) is upstream
    replacement = Owner.method
    replace_attr(Owner, "method", make)  # second call: no-op, no wrapper around the wrapper
    assert Owner.method is replacement and made == [upstream]


def test_apply_scheduler_patches_twice_is_once(pristine):
    upstream = sampler_mod.Sampler
    apply_scheduler_patches(EntropyConfig())
    first = current(SCHEDULER_TARGETS)
    assert all(is_patched(owner, name) for owner, name in SCHEDULER_TARGETS if owner is Scheduler)
    apply_scheduler_patches(EntropyConfig(top_k=3, mode="tempered"))
    second = current(SCHEDULER_TARGETS)
    assert all(a is b for a, b in zip(first, second, strict=True))
    entropy_sampler_cls = sampler_mod.Sampler
    assert entropy_sampler_cls.__bases__ == (upstream,)  # subclassed once, not a subclass of a subclass
    assert [c.__name__ for c in entropy_sampler_cls.__mro__].count("EntropySampler") == 1
    assert entropy_sampler_cls.entropy_config == EntropyConfig(top_k=3, mode="tempered")  # the latest config
    assert (
        original_of(Scheduler.process_batch_result_decode)
        is mixin_mod.SchedulerOutputProcessorMixin.__dict__["process_batch_result_decode"]
    )


def test_apply_tokenizer_patches_twice_is_once(pristine):
    upstream = [TokenizerManager.__dict__[name] for _, name in TOKENIZER_TARGETS]
    apply_tokenizer_patches()
    first = current(TOKENIZER_TARGETS)
    assert all(is_patched(owner, name) for owner, name in TOKENIZER_TARGETS)
    apply_tokenizer_patches()
    assert all(a is b for a, b in zip(first, current(TOKENIZER_TARGETS), strict=True))
    assert [original_of(fn) for fn in first] == upstream


def test_check_signature_names_the_supported_version():
    def process_batch_result_decode(self, batch, result, extra=None):
        pass

    with pytest.raises(UnsupportedSGLangError, match=r"0\.5\.6\.post2") as info:
        check_signature(process_batch_result_decode, ("self", "batch", "result"), "process_batch_result_decode")
    assert "process_batch_result_decode" in str(info.value) and "extra" in str(info.value)
    check_signature(process_batch_result_decode, ("self", "batch", "result", "extra"), "ok")  # exact match passes


def test_changed_upstream_signature_refuses_before_patching_anything(pristine, monkeypatch):
    def process_batch_result_decode(self, batch, result, extra=None):
        pass

    # Scheduler inherits it from the mixin; the pristine fixture gave Scheduler its own attribute, so set both.
    monkeypatch.setattr(
        mixin_mod.SchedulerOutputProcessorMixin, "process_batch_result_decode", process_batch_result_decode
    )
    monkeypatch.setattr(Scheduler, "process_batch_result_decode", process_batch_result_decode)
    before = current(SCHEDULER_TARGETS)
    with pytest.raises(UnsupportedSGLangError, match=r"process_batch_result_decode.*0\.5\.6\.post2"):
        apply_scheduler_patches(EntropyConfig())
    assert all(a is b for a, b in zip(before, current(SCHEDULER_TARGETS), strict=True))


def test_check_sglang_version(pristine, monkeypatch):
    assert check_sglang_version() == SUPPORTED == sglang.__version__
    monkeypatch.setattr(sglang, "__version__", "0.5.7")
    with pytest.raises(UnsupportedSGLangError, match=r"0\.5\.6\.post2.*found 0\.5\.7") as info:
        check_sglang_version()
    assert ENV_ALLOW_UNSUPPORTED in str(info.value)
    before = current(ALL_TARGETS)
    with pytest.raises(UnsupportedSGLangError):
        apply_scheduler_patches(EntropyConfig())
    with pytest.raises(UnsupportedSGLangError):
        apply_tokenizer_patches()
    with pytest.raises(UnsupportedSGLangError):
        tt_engine.install()
    assert all(a is b for a, b in zip(before, current(ALL_TARGETS), strict=True))
    monkeypatch.setenv(ENV_ALLOW_UNSUPPORTED, "1")
    assert check_sglang_version() == "0.5.7"
