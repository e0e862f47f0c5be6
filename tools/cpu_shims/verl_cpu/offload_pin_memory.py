# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Patch 6: FSDP2 CPU offload without pinned memory (the reference model on CPU).

verl 0.9.1: the same, in the engine worker: ``verl/workers/engine/fsdp/transformer_impl.py``
``FSDPEngine._build_fsdp_module`` (lines 450-463) wraps every forward-only engine (the reference model) and any with
``offload_policy`` in ``CPUOffloadPolicy(pin_memory=True)``, looked up as that module's global (imported from
``verl.utils.fsdp_utils``); the replacement below goes there.

Upstream: ``verl/workers/fsdp_workers.py`` (verl 0.7.1), ``ActorRolloutRefWorker._build_model_optimizer``
(lines 615-636). With ``actor.strategy=fsdp2`` every role but the actor is wrapped with
``CPUOffloadPolicy(pin_memory=True)`` unconditionally (line 625, "We force reference policy to use CPUOffload to save
memory"), and so is the actor with ``fsdp_config.offload_policy=True`` (line 621). ``fsdp2_load_full_state_dict``
(``verl/utils/fsdp_utils.py:475``, ``model.to_empty``) then makes FSDP2 pin every sharded parameter
(``torch/distributed/fsdp/_fully_shard/_fsdp_param.py:1045``, ``reset_sharded_param``), and pinning needs an
accelerator: ``RuntimeError: Cannot access accelerator device when none is available.`` when the reference model
(``actor.use_kl_loss=True`` or ``algorithm.use_kl_in_reward=True``) is built on CPU. Pinned memory only speeds up
host-to-device copies, of which a CPU run has none. The replacement of the module global
``fsdp_workers.CPUOffloadPolicy`` (looked up when the model is built) is a subclass of torch's class that always sets
``pin_memory=False``; torch's ``isinstance(..., CPUOffloadPolicy)`` checks still hold, and the offload itself (sharded
parameters kept on the CPU, the device) is unchanged.
"""

from __future__ import annotations

from types import ModuleType

from verl_cpu._guard import (
    MARK,
    PatchError,
    installed_version,
    is_patched,
    require_cpu_only,
    require_signature,
    require_versions,
)

PATCH = "offload_pin_memory"
SUPPORTED = {"verl": ("0.7.1", "0.9.1"), "torch": ("2.13.0",)}
POLICY_INIT_PARAMETERS = ("self", "pin_memory")
BUILD_PARAMETERS_0_7_1 = (
    "self",
    "model_path",
    "fsdp_config",
    "optim_config",
    "override_model_config",
    "use_remove_padding",
    "use_fused_kernels",
    "enable_gradient_checkpointing",
    "trust_remote_code",
    "use_liger",
    "role",
    "enable_activation_offload",
    "use_prefix_grouper",
    "use_tiled_mlp",
    "tiled_mlp_shards",
)
# verl version -> (the module whose global is replaced, the class and method that build the policy, its parameters)
BUILDERS = {
    "0.7.1": (
        "verl/workers/fsdp_workers.py",
        "ActorRolloutRefWorker",
        "_build_model_optimizer",
        BUILD_PARAMETERS_0_7_1,
    ),
    "0.9.1": ("verl/workers/engine/fsdp/transformer_impl.py", "FSDPEngine", "_build_fsdp_module", ("self", "module")),
}


def apply(builder_module: ModuleType) -> None:
    """Replace ``builder_module.CPUOffloadPolicy`` (verl 0.7.1: ``fsdp_workers``; 0.9.1: the FSDP engine's module)."""
    current = builder_module.CPUOffloadPolicy
    if is_patched(current):
        return
    require_cpu_only(PATCH)
    require_versions(PATCH, SUPPORTED)
    from torch.distributed.fsdp import CPUOffloadPolicy as torch_policy

    where, owner, method, parameters = BUILDERS[installed_version("verl")]
    if current is not torch_policy:
        raise PatchError(
            f"verl_cpu.{PATCH}: {where}:CPUOffloadPolicy is {current!r}, not torch's "
            "torch.distributed.fsdp.CPUOffloadPolicy; re-check the upstream code."
        )
    require_signature(
        PATCH,
        current.__init__,
        POLICY_INIT_PARAMETERS,
        "torch/distributed/fsdp/_fully_shard/_fsdp_api.py:CPUOffloadPolicy",
    )
    require_signature(PATCH, getattr(getattr(builder_module, owner), method), parameters, f"{where}:{owner}.{method}")

    class CPUOffloadPolicy(current):
        """torch's ``CPUOffloadPolicy`` with ``pin_memory=False`` whatever is asked (no accelerator to pin for)."""

        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=False)

    CPUOffloadPolicy.__module__ = __name__
    CPUOffloadPolicy.__wrapped__ = current
    setattr(CPUOffloadPolicy, MARK, PATCH)
    builder_module.CPUOffloadPolicy = CPUOffloadPolicy
