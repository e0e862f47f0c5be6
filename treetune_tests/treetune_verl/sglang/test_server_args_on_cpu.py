# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``server_args``: sglang settings under which entropy would be missing or misaligned are refused up front.

On real sglang 0.5.6.post2 ``ServerArgs`` (the CPU Engine settings pass) and on plain objects with the same attribute
names: each unsupported layout (dp > 1, speculative decoding, pp > 1, disaggregation) is refused by name, all of them
at once, and ``apply_scheduler_patches`` refuses them before patching anything.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from treetune_tests.treetune_verl.sglang.sglang_objects import SCHEDULER_TARGETS, current
from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import UnsupportedSGLangError
from treetune_verl.sglang.server_args import check_server_args
from treetune_verl.sglang.v0_5_6_post2.scheduler_patches import apply_scheduler_patches

REFUSED = [
    ("dp_size", 2, "dp_size > 1"),
    ("speculative_algorithm", "EAGLE", "speculative decoding"),
    ("pp_size", 2, "pp_size > 1"),
    ("disaggregation_mode", "prefill", "disaggregated"),
]


@pytest.mark.parametrize(("field", "value", "message"), REFUSED)
def test_check_server_args_refuses_unsupported_layouts(pristine, server_args, field, value, message):
    check_server_args(server_args)  # the CPU defaults are fine
    bad = copy.copy(server_args)
    setattr(bad, field, value)
    with pytest.raises(UnsupportedSGLangError, match=f"does not support: {message}"):
        check_server_args(bad)
    before = current(SCHEDULER_TARGETS)
    with pytest.raises(UnsupportedSGLangError, match=message):
        apply_scheduler_patches(EntropyConfig(), bad)
    assert all(a is b for a, b in zip(before, current(SCHEDULER_TARGETS), strict=True))  # refused before patching


def test_check_server_args_names_every_refused_setting():
    bad = SimpleNamespace(**{field: value for field, value, _ in REFUSED})
    with pytest.raises(UnsupportedSGLangError) as info:
        check_server_args(bad)
    message = str(info.value)
    assert all(what in message for _, _, what in REFUSED), message
    assert message.count(";") == len(REFUSED) - 1


def test_absent_attributes_read_as_sglang_defaults():
    check_server_args(SimpleNamespace())  # nothing set: sglang's defaults, all supported
    check_server_args(SimpleNamespace(dp_size=1, pp_size=1, speculative_algorithm=None, disaggregation_mode="null"))
    with pytest.raises(UnsupportedSGLangError, match="pp_size > 1"):
        check_server_args(SimpleNamespace(pp_size=4))
