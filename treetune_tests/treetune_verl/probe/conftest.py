# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    # The tiny models are overhead-bound; one thread avoids oversubscribing a shared 2-core machine.
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
