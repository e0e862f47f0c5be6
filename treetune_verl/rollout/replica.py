# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""``EntropySGLangReplica``: verl 0.7.1's ``SGLangReplica`` launching the entropy server.

Only the server class changes; the actor names (``sglang_server_{replica}_{node}``), which verl's hybrid
``ServerAdapter`` looks servers up by, stay the parent's. The manager selects this replica (imports sglang).
"""

from __future__ import annotations

from typing import Any

import ray

from treetune_verl.rollout.server import EntropySGLangHttpServer, SGLangReplica


class EntropySGLangReplica(SGLangReplica):
    """verl's ``SGLangReplica`` launching :class:`EntropySGLangHttpServer` under the parent's actor names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(EntropySGLangHttpServer)
