# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The servers' token ledger (carry-over on verl 0.9.1): counts by hand."""

from __future__ import annotations

import pytest

from treetune_verl.rollout.token_ledger import TokenLedger


def test_a_step_reads_what_it_generated_and_each_group_what_it_holds():
    ledger = TokenLedger()
    ledger.add("tts-a:", 5)
    ledger.add("tts-b:", 3)
    ledger.add("tts-a:", 2)  # a's cut turn resumed
    assert ledger.take_generated() == 10 and ledger.take_generated() == 0  # taken: the next step starts at 0
    assert ledger.session_tokens(["tts-a:", "tts-b:"]) == 10  # read, kept (a carried group)
    assert ledger.session_tokens(["tts-a:"], forget=True) == 7 and ledger.sessions() == 1  # a resolved
    assert ledger.session_tokens(["tts-a:", "tts-unknown:"]) == 0
    ledger.add("tts-b:", 4)
    assert ledger.take_generated() == 4 and ledger.session_tokens(["tts-b:"], forget=True) == 7
    assert ledger.sessions() == 0  # nothing left once every group is resolved


def test_a_negative_count_is_refused():
    with pytest.raises(ValueError, match="tts-a:: -1 tokens"):
        TokenLedger().add("tts-a:", -1)
