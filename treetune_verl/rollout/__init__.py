# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The verl side's server: verl 0.7.1's sglang server and replica serving per-token entropy next to the tokens.

Along the entropy's path: ``server.EntropySGLangHttpServer`` turns the sglang side on (``install``) and returns
``token_output.EntropyTokenOutput`` (the wire type to the agent loops); ``replica.EntropySGLangReplica`` launches it;
``rollout_config`` reads and checks ``actor_rollout_ref.rollout.custom.entropy``. Importing this package does not
import sglang (``server`` and ``replica`` do: import them only where servers start).
"""
