# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The one wrap mechanism (``treetune_verl/patching.py``) that every sglang and verl seam goes through.

Its two real instances are exercised on the installed packages by the sglang patch tests and the trainer / actor seam
tests; here the mechanics themselves on an owner written in the test: versions refused naming what to install,
signatures checked before anything is replaced (all or none), idempotence, restore, the per-call instance swap, and
the one exception to wrapping (``Replace``): upstream's value checked first, set once, restored.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from treetune_verl.patching import Replace, Upstream, Wrap, is_patched, is_replaced, original_of, restore, swapped
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


def _keys_replacement(module, expect_first="a"):
    return Replace(
        module,
        "KEYS",
        lambda keys: (*keys, "ours"),
        lambda keys: None if isinstance(keys, tuple) and keys[:1] == (expect_first,) else f"KEYS is {keys!r}",
        why="a tuple of key names (data): ours appended",
        where="module.KEYS",
    )


def test_a_replacement_is_set_once_and_restored():
    module = SimpleNamespace(KEYS=("a", "b"))
    upstream = module.KEYS
    TORCH.replace(_keys_replacement(module))
    assert module.KEYS == ("a", "b", "ours") and is_replaced(module, "KEYS")
    TORCH.replace(_keys_replacement(module))  # idempotent: ours found, not extended again
    assert module.KEYS == ("a", "b", "ours")
    restore(module, "KEYS")
    assert module.KEYS is upstream and not is_replaced(module, "KEYS")
    restore(module, "KEYS")  # no-op when not replaced
    assert module.KEYS is upstream


def test_a_replacement_refuses_an_unexpected_upstream_value_before_anything_is_set():
    module = SimpleNamespace(KEYS=("a",), OTHER=["x"])
    other = Replace(module, "OTHER", lambda v: [*v, "y"], lambda v: None, why="a list extended")
    with pytest.raises(Refused, match=r"torch module\.KEYS: KEYS is \('z',\) \(torch 0\.0\.1\)"):
        TORCH.replace(other, _keys_replacement(SimpleNamespace(KEYS=("z",))))
    assert module.OTHER == ["x"] and not is_replaced(module, "OTHER")  # the first was fine, nothing was set


def test_a_value_changed_after_the_replacement_is_not_taken_for_ours():
    """Someone else set the attribute after us: ``is_replaced`` says no, a second ``replace`` checks and sets again,
    ``restore`` leaves the other value alone rather than putting a stale original back."""
    module = SimpleNamespace(KEYS=("a",))
    TORCH.replace(_keys_replacement(module))
    module.KEYS = ("a", "theirs")
    assert not is_replaced(module, "KEYS")
    restore(module, "KEYS")
    assert module.KEYS == ("a", "theirs")
    TORCH.replace(_keys_replacement(module))
    assert module.KEYS == ("a", "theirs", "ours")


def test_a_replacement_must_say_why():
    with pytest.raises(ValueError, match="say why it is not a Wrap"):
        Replace(SimpleNamespace(KEYS=()), "KEYS", lambda v: v, lambda v: None, why=" ")
