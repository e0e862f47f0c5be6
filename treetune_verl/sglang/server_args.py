# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The sglang server settings under which per-token entropy would be missing or misaligned, refused up front.

One check, run wherever server arguments are known before a scheduler starts: by ``install()``'s wrapper of
``_launch_subprocesses`` (in-process Engines), inside the spawned scheduler (``scheduler_patches``), and on the
arguments verl is about to build (``treetune_verl.rollout.rollout_config``). Imports nothing from sglang.
"""

from __future__ import annotations

from typing import Any

from treetune_verl.sglang.config import EntropyConfig
from treetune_verl.sglang.patching import UnsupportedSGLangError, installed_sglang_version

_DP_REASON = {
    "0.5.6.post2": "the data-parallel controller starts schedulers with sglang's own run_scheduler_process, "
    "bypassing the injected one",
    # The plugin does load in data-parallel schedulers (run_scheduler_process calls load_plugins), but the controller
    # routes outputs of several schedulers through one TokenizerManager: not tested with entropy yet.
    "0.5.12": "data-parallel schedulers are not tested with the entropy plugin",
}


def check_server_args(server_args: Any, mode: str | None = None) -> None:
    """Refuse configurations in which per-token entropy would be missing or misaligned.

    ``server_args`` is sglang's ``ServerArgs`` or anything with the same attribute names (absent ones read as
    sglang's defaults). ``mode``: the entropy mode the Engine will run (default: the one exported by ``install``);
    mode ``support`` also refuses what samples somewhere our capture does not read (``support_capture.py``).

    Raises:
        UnsupportedSGLangError: naming every refused setting.
    """
    refusals = {
        f"dp_size > 1 ({_DP_REASON.get(installed_sglang_version(), _DP_REASON['0.5.12'])})": getattr(
            server_args, "dp_size", 1
        )
        > 1,
        "speculative decoding (several tokens per step, sampled outside the patched Sampler)": getattr(
            server_args, "speculative_algorithm", None
        )
        is not None,
        "pp_size > 1 (pipeline-parallel result processing is not patched)": getattr(server_args, "pp_size", 1) > 1,
        "disaggregated prefill/decode (not patched)": getattr(server_args, "disaggregation_mode", "null") != "null",
    }
    if (mode or EntropyConfig.from_env().mode) == "support":
        refusals.update(
            {
                f"sampling_backend={getattr(server_args, 'sampling_backend', None)!r} with entropy mode 'support' "
                "(flashinfer samples inside its kernel, where the support cannot be read: set "
                "sampling_backend='pytorch')": getattr(server_args, "sampling_backend", None) != "pytorch",
                "enable_deterministic_inference with entropy mode 'support' (sglang samples untruncated steps from "
                "its bf16 log-softmax, not the distribution the support is read from)": bool(
                    getattr(server_args, "enable_deterministic_inference", False)
                ),
                "enable_custom_logit_processor with entropy mode 'support' (processors change the logits after the "
                "untruncated support is read)": bool(getattr(server_args, "enable_custom_logit_processor", False)),
            }
        )
    refused = [what for what, bad in refusals.items() if bad]
    if refused:
        raise UnsupportedSGLangError("treetune entropy extraction does not support: " + "; ".join(refused))
