# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The one wrap mechanism (``treetune_verl/patching.py``) that every sglang and verl seam goes through.

Its two real instances are exercised on the installed packages by the sglang patch tests and the trainer / actor seam
tests; here the mechanics themselves on an owner written in the test: versions refused naming what to install,
signatures checked before anything is replaced (all or none), idempotence, restore, and the per-call instance swap.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from treetune_verl.patching import Upstream, Wrap, is_patched, original_of, restore, swapped
from treetune_verl.sglang.patching import SGLANG
from treetune_verl.verl_guard import VERL


class Refused(RuntimeError):
    pass


# "torch" as the patched package: installed, with a version that is not "0.0.1".
TORCH = Upstream("torch", ("0.0.1",), Refused, allow_env="TREETUNE_TEST_ALLOW")


def _owner():
    class Owner:
        def run(self, x):
            return f"upstream {x}"

        def stop(self, x, y):
            return "stop"

    return Owner


def _tag(original):
    def run(self, x):
        return "wrapped " + original(self, x)

    return run


def test_require_names_the_supported_version_and_honours_the_escape_hatch(monkeypatch):
    with pytest.raises(Refused, match=r"treetune_verl's demo patches support torch 0\.0\.1; found .*torch==0\.0\.1"):
        TORCH.require("demo patches")
    monkeypatch.setenv("TREETUNE_TEST_ALLOW", "1")
    import torch

    assert TORCH.require("demo patches") == torch.__version__


def test_wrap_replaces_once_and_restore_puts_upstream_back():
    Owner = _owner()
    upstream = Owner.run
    TORCH.wrap(Wrap(Owner, "run", _tag, ("self", "x")))
    first = Owner.run
    TORCH.wrap(Wrap(Owner, "run", _tag, ("self", "x")))  # idempotent: no wrapper around the wrapper
    assert Owner.run is first and original_of(first) is upstream and is_patched(Owner, "run")
    assert Owner().run(1) == "wrapped upstream 1"
    restore(Owner, "run")
    assert Owner.run is upstream and not is_patched(Owner, "run")
    restore(Owner, "run")  # no-op when unpatched


def test_a_changed_signature_refuses_before_anything_is_replaced():
    Owner = _owner()
    with pytest.raises(
        Refused, match=r"torch Owner\.stop has signature \('self', 'x', 'y'\), expected \('self', 'x'\)"
    ):
        TORCH.wrap(
            Wrap(Owner, "run", _tag, ("self", "x")),
            Wrap(Owner, "stop", _tag, ("self", "x"), "Owner.stop"),
        )
    assert not is_patched(Owner, "run")  # the first target was fine, but nothing was replaced


def test_unwrap_picks_the_function_whose_signature_counts():
    def decorated(fn):
        def hidden(*args, **kwargs):  # hides fn's signature, as verl's GPUMemoryLogger does
            return fn(*args, **kwargs)

        hidden.inner = fn
        return hidden

    Owner = _owner()
    Owner.run = decorated(Owner.run)
    with pytest.raises(Refused):
        TORCH.wrap(Wrap(Owner, "run", _tag, ("self", "x")))
    TORCH.wrap(Wrap(Owner, "run", _tag, ("self", "x"), unwrap=lambda fn: fn.inner))
    assert Owner().run(2) == "wrapped upstream 2"


def test_swapped_restores_the_instance_attribute_also_on_exceptions():
    obj = SimpleNamespace()
    with swapped(obj, "step", "mine"):
        assert obj.step == "mine"
    assert not hasattr(obj, "step")  # it had none: deleted
    obj.step = "own"
    with pytest.raises(KeyError), swapped(obj, "step", "mine"):
        raise KeyError
    assert obj.step == "own"


def test_the_two_upstreams_name_their_pinned_versions():
    assert SGLANG.supported == ("0.5.6.post2", "0.5.12") and SGLANG.allow_env is not None  # pinned, current
    assert VERL.supported == ("0.7.1",) and VERL.allow_env is None
    assert SGLANG.error is not VERL.error
