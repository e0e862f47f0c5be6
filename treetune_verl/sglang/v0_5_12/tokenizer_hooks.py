# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""In the process that owns sglang 0.5.12's TokenizerManager (the parent): our values out of ``customized_info``.

- ``TokenizerManager._handle_batch_output``: before sglang builds each row's ``meta_info``, our key is popped from the
  output's ``customized_info`` (else sglang would copy each chunk, unaligned with streaming, into ``meta_info``) and
  put into the output's ``output_token_entropy_val``, where the shared ``tokenizer_patches`` accumulate it per request
  and write ``meta_info["output_token_entropy"]``, as on 0.5.6.post2. An output whose list does not have one entry
  per row is refused (logged; its requests get no entropy from then on rather than another request's values or a list
  with gaps: ``None`` per row marks them for the shared patches).
- ``_INCREMENTAL_STREAMING_META_INFO_KEYS``: with ``incremental_streaming_output`` sglang slices these keys to each
  chunk's new tokens; ours join them so the entropy (and support) of a chunk stays aligned with its logprobs.
- ``ServerArgs.check_server_args`` (called by ``Engine._launch_subprocesses`` before anything is spawned, also on
  verl's path): our refusals (``server_args.check_server_args``) after sglang's own.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from treetune_verl.sglang.patching import SGLANG, Replace, Wrap
from treetune_verl.sglang.server_args import check_server_args
from treetune_verl.sglang.tokenizer_patches import META_INFO_ENTROPY_KEY, META_INFO_SUPPORT_KEY
from treetune_verl.sglang.v0_5_12.scheduler_hooks import CUSTOMIZED_INFO_KEY

logger = logging.getLogger(__name__)

_HANDLE_BATCH_OUTPUT_PARAMS = ("self", "recv_obj")  # sglang 0.5.12 managers/tokenizer_manager.py
_CHECK_SERVER_ARGS_PARAMS = ("self",)  # sglang 0.5.12 server_args.py ServerArgs.check_server_args


def move_entropy_out_of_customized_info(recv_obj) -> None:
    """``recv_obj.customized_info[CUSTOMIZED_INFO_KEY]`` -> ``recv_obj.output_token_entropy_val`` (one list per row;
    ``None`` per row when the lists do not line up with the rows)."""
    info = getattr(recv_obj, "customized_info", None)
    if not info or CUSTOMIZED_INFO_KEY not in info:
        return
    chunks = info.pop(CUSTOMIZED_INFO_KEY)
    if len(chunks) != len(recv_obj.rids):
        logger.error(
            "treetune entropy: an sglang output has %d entropy lists for %d requests (a request without sglang's "
            "customized_info in the batch?); its requests get no entropy.",
            len(chunks),
            len(recv_obj.rids),
        )
        recv_obj.output_token_entropy_val = [None] * len(recv_obj.rids)
        return
    recv_obj.output_token_entropy_val = chunks


def _wrap_handle_batch_output(original):
    @functools.wraps(original)
    async def _handle_batch_output(self, recv_obj):
        move_entropy_out_of_customized_info(recv_obj)
        return await original(self, recv_obj)

    return _handle_batch_output


def _wrap_check_server_args(original):
    @functools.wraps(original)
    def check(self):
        original(self)
        check_server_args(self)

    return check


def _streaming_keys_expected(keys: Any) -> str | None:
    if isinstance(keys, tuple) and "output_token_logprobs" in keys:
        return None
    return f"is {keys!r}, expected a tuple naming output_token_logprobs: incremental streams would be misaligned"


def _with_entropy_key(keys: tuple[str, ...]) -> tuple[str, ...]:
    return (*keys, *(key for key in (META_INFO_ENTROPY_KEY, META_INFO_SUPPORT_KEY) if key not in keys))


def apply_tokenizer_hooks() -> None:
    """The parent-side hooks of 0.5.12 (idempotent). The shared ``tokenizer_patches`` are applied by the caller."""
    from sglang.srt.managers import tokenizer_manager as tokenizer_manager_mod
    from sglang.srt.server_args import ServerArgs

    # First: a refused key tuple leaves nothing patched (alone, an extra key name in it is harmless).
    SGLANG.replace(  # managers/tokenizer_manager.py: the meta-info keys a stream slices per chunk
        Replace(
            tokenizer_manager_mod,
            "_INCREMENTAL_STREAMING_META_INFO_KEYS",
            _with_entropy_key,
            _streaming_keys_expected,
            why="a tuple of key names (data, not a callable): ours appended",
            where="managers/tokenizer_manager.py _INCREMENTAL_STREAMING_META_INFO_KEYS",
        )
    )
    SGLANG.wrap(
        Wrap(
            tokenizer_manager_mod.TokenizerManager,
            "_handle_batch_output",
            _wrap_handle_batch_output,
            _HANDLE_BATCH_OUTPUT_PARAMS,
            "TokenizerManager._handle_batch_output",
        ),
        Wrap(ServerArgs, "check_server_args", _wrap_check_server_args, _CHECK_SERVER_ARGS_PARAMS),
    )
