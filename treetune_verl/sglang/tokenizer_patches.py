# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patches on sglang's ``TokenizerManager`` (0.5.6.post2 and 0.5.12 alike), in the process that owns the Engine.

Last stop of the sglang side: the entropy values that the scheduler sent with each output chunk become
``meta_info["output_token_entropy"]`` of the request (and, in mode ``support``, ``meta_info["output_token_support"]``).

``convert_logprob_style`` runs for every output chunk of a request with ``return_logprob=True``: the wrapper
extends a per-request list kept on sglang's own ``ReqState`` (so it is freed with the request) with the chunk's
``output_token_entropy_val`` (filled by the scheduler's senders on 0.5.6.post2, moved there from sglang's
``customized_info`` by ``v0_5_12/tokenizer_hooks.py`` on 0.5.12). ``add_logprob_to_meta_info`` (also called directly for aborts) then copies that list
to ``meta_info["output_token_entropy"]``, one value per entry of ``meta_info["output_token_logprobs"]``.
"""

from __future__ import annotations

import functools
import logging

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import SGLANG, Wrap, check_sglang_version

logger = logging.getLogger(__name__)

META_INFO_ENTROPY_KEY = "output_token_entropy"  # list[float], nats, aligned with "output_token_logprobs"
# Mode "support" only: list[(size, kept_mass, sampled_logprob, token_ids | None)] aligned with the same
# (support.TOKEN_SUPPORT_FIELDS); the scheduler sends (entropy, support) per token, split here.
META_INFO_SUPPORT_KEY = "output_token_support"
REQ_STATE_ENTROPY_ATTR = "treetune_output_token_entropy"  # list[float] on sglang's ReqState
# True on sglang's ReqState once one of the request's chunks was refused (a version adapter found an output whose
# entropy lists do not line up with its rows) or its values stopped lining up with its logprobs: the request gets no
# entropy from then on (a missing key, which callers report), never a list that lacks some tokens' values.
REQ_STATE_REFUSED_ATTR = "treetune_output_token_entropy_refused"

# Signatures the wrappers repeat: sglang 0.5.6.post2 and 0.5.12 managers/tokenizer_manager.py TokenizerManager.
_CONVERT_PARAMS = (
    "self",
    "meta_info",
    "state",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_text_in_logprobs",
    "recv_obj",
    "recv_obj_index",
)
_ADD_TO_META_PARAMS = ("self", "meta_info", "state", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs")

_warned_unpatched_scheduler = False


def _state_entropy(state) -> list[float]:
    values = getattr(state, REQ_STATE_ENTROPY_ATTR, None)
    if values is None:
        values = []
        setattr(state, REQ_STATE_ENTROPY_ATTR, values)
    return values


def _wrap_convert(original):
    @functools.wraps(original)
    def convert_logprob_style(
        self, meta_info, state, top_logprobs_num, token_ids_logprob, return_text_in_logprobs, recv_obj, recv_obj_index
    ):
        global _warned_unpatched_scheduler
        if recv_obj.input_token_logprobs_val is not None:  # sglang returns early otherwise; so do we
            chunk = recv_obj.output_token_entropy_val
            row = None if chunk is None else chunk[recv_obj_index]
            if row is not None:
                _state_entropy(state).extend(row)
            elif chunk is not None:  # this row refused by the version adapter (logged there)
                setattr(state, REQ_STATE_REFUSED_ATTR, True)
            elif not _warned_unpatched_scheduler:
                _warned_unpatched_scheduler = True
                logger.error(
                    "treetune entropy: the TokenizerManager is patched but outputs carry no entropy: the scheduler "
                    "process runs without our patches (see treetune_verl.sglang.engine.install)."
                )
        return original(
            self,
            meta_info,
            state,
            top_logprobs_num,
            token_ids_logprob,
            return_text_in_logprobs,
            recv_obj,
            recv_obj_index,
        )

    return convert_logprob_style


def _wrap_add_to_meta(original):
    @functools.wraps(original)
    def add_logprob_to_meta_info(self, meta_info, state, top_logprobs_num, token_ids_logprob, return_text_in_logprobs):
        original(self, meta_info, state, top_logprobs_num, token_ids_logprob, return_text_in_logprobs)
        if getattr(state, REQ_STATE_REFUSED_ATTR, False):
            return
        values = getattr(state, REQ_STATE_ENTROPY_ATTR, None)
        logprobs = meta_info["output_token_logprobs"]  # the request's whole list so far (sglang slices it later)
        if values is not None and len(values) != len(logprobs):
            setattr(state, REQ_STATE_REFUSED_ATTR, True)
            logger.error(
                "treetune entropy: request %s has %d entropy values for %d output logprobs; it gets no entropy.",
                getattr(getattr(state, "obj", None), "rid", "?"),
                len(values),
                len(logprobs),
            )
        elif values is not None:  # copies: the state's list keeps growing while streaming
            if values and isinstance(values[0], tuple):  # mode "support": (entropy, support) per token
                meta_info[META_INFO_ENTROPY_KEY] = [entropy for entropy, _ in values]
                meta_info[META_INFO_SUPPORT_KEY] = [support for _, support in values]
            else:
                meta_info[META_INFO_ENTROPY_KEY] = list(values)
        elif not logprobs:  # no token yet (e.g. aborted while waiting): nothing to align
            meta_info[META_INFO_ENTROPY_KEY] = []
            if EntropyConfig.from_env().mode == "support":
                meta_info[META_INFO_SUPPORT_KEY] = []

    return add_logprob_to_meta_info


def apply_tokenizer_patches() -> None:
    """Patch ``TokenizerManager`` (idempotent)."""
    check_sglang_version()
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    SGLANG.wrap(
        Wrap(
            TokenizerManager,
            "convert_logprob_style",
            _wrap_convert,
            _CONVERT_PARAMS,
            "TokenizerManager.convert_logprob_style",
        ),
        Wrap(
            TokenizerManager,
            "add_logprob_to_meta_info",
            _wrap_add_to_meta,
            _ADD_TO_META_PARAMS,
            "TokenizerManager.add_logprob_to_meta_info",
        ),
    )
