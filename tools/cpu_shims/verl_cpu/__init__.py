# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""CPU-only runtime patches that let verl's own trainer run on a machine without an accelerator, on both stacks.

``python -m verl.trainer.main_ppo`` (Ray, an FSDP2 actor, an sglang rollout server) assumes a GPU in a few places.
Each module here fixes one, right after its target module is imported, in every process of the run (driver, Ray
workers, sglang's spawned scheduler processes). Which patches apply depends on the installed verl
(:data:`verl_cpu.hook.PATCHES_BY_VERL`): verl 0.7.1 + sglang 0.5.6.post2 (pinned) or verl 0.9.1 + sglang 0.5.12
(current); any other verl is refused.

======================  ==================================  =====================================================
patch module            target module (applied after it)    upstream code it works around
======================  ==================================  =====================================================
``cpu_platform``        ``verl.plugin.platform.             0.9.1 only: verl asks its platform registry every
                        platform_manager``                  device question and falls back to ``nvidia``; adds a
                                                            ``cpu`` platform (``VERL_PLATFORM=cpu`` selects it)
``dist_backend``        ``verl.workers.fsdp_workers``       backend ``"cpu:gloo,cpu:nccl"`` / ``"cpu:gloo,cpu:gloo"``
                        (0.7.1), ``verl.utils.distributed`` (torch: duplicate device type)
                        (0.9.1)
``torch_cpu_memory``    ``verl.utils.device``               ``torch.cpu`` lacks ``memory_allocated`` & co. that
                                                            ``verl/utils/memory_utils.py`` & co. call
``sglang_device``       ``sglang.srt.server_args``          ``get_device()`` raises without an accelerator
``sharing_strategy``    ``sglang.srt.utils.common``         CPU tensors via ``MultiprocessingSerializer`` need the
                                                            ``file_system`` strategy between unrelated processes
``sglang_reduce``       ``sglang.srt.utils.patch_torch``    ``_reduce_tensor_modified`` indexes the CUDA reduce
                                                            tuple (``IndexError`` for a CPU tensor)
``offload_pin_memory``  ``verl.workers.fsdp_workers``       the reference model's FSDP2 ``CPUOffloadPolicy``
                        (0.7.1), ``verl.workers.engine.     pins memory, which needs an accelerator
                        fsdp.transformer_impl`` (0.9.1)     (``RuntimeError``)
======================  ==================================  =====================================================

Nothing here is part of the ``treetune_verl`` package. ``tools/cpu_env/setup.sh`` (CPU setup only; a GPU install never
runs it) writes a ``.pth`` file into the venv whose import line installs :mod:`verl_cpu.hook` when the environment
variable ``TREETUNE_VERL_CPU_PATCHES=1`` is set (the e2e script sets it when torch sees no CUDA). Without it nothing is
imported beyond this check. Every patch refuses to run on a CUDA machine, checks the installed versions and the exact
signature of what it replaces, is idempotent, and raises :class:`verl_cpu._guard.PatchError` naming the supported
versions on any mismatch.
"""

ENV_SWITCH = "TREETUNE_VERL_CPU_PATCHES"
