# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``store``: ``EntropyStore`` hands out each request's values once, in order, and forgets finished requests.

Plain Python, no sglang. Reference: the values appended by hand (offsets mirror sglang's
``send_output_token_logprobs_offset``).
"""

from treetune_verl.sglang.v0_5_6_post2.store import EntropyStore


class TestEntropyStore:
    def test_append_and_get(self):
        store = EntropyStore()
        store.append("a", 0.5)
        store.append("a", 1.5)
        assert store.get_since_offset("a") == [0.5, 1.5]

    def test_incremental_offsets(self):
        store = EntropyStore()
        store.append("a", 1.0)
        store.append("a", 2.0)
        assert store.get_since_offset("a") == [1.0, 2.0]
        assert store.get_since_offset("a") == []
        store.append("a", 3.0)
        assert store.get_since_offset("a") == [3.0]

    def test_cleanup(self):
        store = EntropyStore()
        store.append("a", 1.0)
        store.cleanup("a")
        assert store.get_since_offset("a") == [] and len(store) == 0 and "a" not in store
        store.cleanup("a")  # twice is fine

    def test_unknown_rid_is_empty_and_creates_no_state(self):
        store = EntropyStore()
        assert store.get_since_offset("nope") == []
        assert len(store) == 0

    def test_isolation_between_requests(self):
        store = EntropyStore()
        for v in (1.0, 2.0):
            store.append("a", v)
        store.append("b", 9.0)
        assert store.get_since_offset("b") == [9.0]
        assert store.get_since_offset("a") == [1.0, 2.0]
        store.cleanup("a")
        store.append("b", 8.0)
        assert store.get_since_offset("b") == [8.0] and len(store) == 1

    def test_values_are_floats_and_membership_follows_state(self):
        store = EntropyStore()
        assert "a" not in store
        store.append("a", 1)  # an int from .tolist() of an integral tensor would still be sent as a float
        assert "a" in store and len(store) == 1
        (value,) = store.get_since_offset("a")
        assert type(value) is float and value == 1.0
        assert "a" in store  # sent values do not end a request's state; cleanup does
