# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""The CPU runtime patches of ``tools/cpu_shims/verl_cpu`` on the real installed torch / verl / sglang.

Patches change process-wide state (``torch.distributed.init_process_group``, ``torch.cpu``, torch's sharing strategy,
sglang's reduction hook), so every test that applies one does it in a fresh interpreter; the guard tests run here and
fail before anything is changed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU patches refuse to run where CUDA exists")

verl_cpu = pytest.importorskip("verl_cpu", reason="tools/cpu_shims is not on sys.path (run tools/cpu_env/setup.sh)")
from verl_cpu import ENV_SWITCH, hook  # noqa: E402
from verl_cpu._guard import MARK, PatchError  # noqa: E402

PATCH_MODULES = sorted({name for names in hook.PATCHES.values() for name in names})
VERL = importlib.metadata.version("verl")
pinned_only = pytest.mark.skipif(VERL != "0.7.1", reason="verl 0.7.1's fsdp_workers (the pinned stack)")
# Where each verl builds the reference model's FSDP2 offload policy (offload_pin_memory replaces that module's global).
OFFLOAD_BUILDER = {
    "0.7.1": ("verl.workers.fsdp_workers", "ActorRolloutRefWorker", "_build_model_optimizer"),
    "0.9.1": ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngine", "_build_fsdp_module"),
}[VERL]
current_only = pytest.mark.skipif(VERL != "0.9.1", reason="verl 0.9.1's platform registry (the current stack)")


def target_of(patch: str) -> str:
    """The module a patch is applied to on the installed verl (``hook.PATCHES``)."""
    return next(t for t, names in hook.PATCHES.items() if f"verl_cpu.{patch}" in names or patch in names)


def _run(code: str, *, switch: bool, timeout: int = 300, **extra_env: str) -> dict:
    """Run ``code`` in a fresh interpreter of this venv; it prints one JSON object as its last line."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_SWITCH, "VERL_PLATFORM")}
    if switch:
        env[ENV_SWITCH] = "1"
    env.update(extra_env)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_switch_off_installs_nothing():
    out = _run(
        """
        import json, sys
        import verl.utils.device, torch
        print(json.dumps({"hook": any(type(f).__name__ == "PatchFinder" for f in sys.meta_path),
                          "loaded": "verl_cpu" in sys.modules,
                          "memory": hasattr(torch.cpu, "memory_allocated")}))
        """,
        switch=False,
    )
    assert out == {"hook": False, "loaded": False, "memory": False}


def test_bench_switch_fixes_response_length_only_when_set():
    """``TREETUNE_BENCH_FIXED_LENGTH=1`` (the overhead bench, both arms): sglang's real ``SamplingParams`` ignore EOS
    whatever the request says; with the CPU switch alone they keep the request's value."""
    code = """
        import json
        from sglang.srt.sampling.sampling_params import SamplingParams
        params = SamplingParams(max_new_tokens=8, ignore_eos=False)
        params.normalize(None); params.verify(32000)
        print(json.dumps({"ignore_eos": params.ignore_eos, "max_new_tokens": params.max_new_tokens,
                          "patched": getattr(SamplingParams.__init__, "__treetune_verl_cpu_patch__", None)}))
        """
    assert _run(code, switch=True) == {"ignore_eos": False, "max_new_tokens": 8, "patched": None}
    assert _run(code, switch=True, **{hook.BENCH_SWITCH: "1"}) == {
        "ignore_eos": True,
        "max_new_tokens": 8,
        "patched": "bench_fixed_length",
    }


def test_bench_fixed_length_guards(monkeypatch):
    import sglang.srt.sampling.sampling_params as sampling_params
    from verl_cpu import _guard, bench_fixed_length

    class Changed:
        def __init__(self, max_new_tokens=128, ignore_eos=False):
            self.ignore_eos = ignore_eos

    monkeypatch.setattr(sampling_params, "SamplingParams", Changed)
    with pytest.raises(PatchError, match="SamplingParams.__init__ has parameters"):
        bench_fixed_length.apply(sampling_params)
    monkeypatch.undo()
    monkeypatch.setattr(_guard.importlib.metadata, "version", lambda name: "0.0.1")
    with pytest.raises(PatchError, match="written for sglang .* 0.0.1 is installed"):
        bench_fixed_length.apply(sampling_params)
    assert not _guard.is_patched(sampling_params.SamplingParams.__init__)


@pinned_only
def test_hook_applies_every_patch_in_a_fresh_process():
    """With the switch on, the .pth hook patches each target right after its import, and each patch works."""
    out = _run(
        """
        import datetime, inspect, json, socket, sys
        import torch, torch.distributed as dist
        import verl.workers.fsdp_workers as fsdp_workers  # -> dist_backend; verl.utils.device -> torch_cpu_memory
        import sglang.srt.server_args as server_args  # -> sglang_device
        import sglang.srt.utils.common as common  # -> sharing_strategy
        import sglang.srt.utils.patch_torch as patch_torch  # -> sglang_reduce
        from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device

        MARK = "__treetune_verl_cpu_patch__"
        out = {"hook": sum(type(f).__name__ == "PatchFinder" for f in sys.meta_path)}
        # 1. verl's own backend string, through the patched torch function, gives a working gloo group
        backend = f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group(backend=backend, rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}",
                                timeout=datetime.timedelta(seconds=60))
        t = torch.ones(3); dist.all_reduce(t)
        out["dist"] = [backend, dist.get_backend(), t.tolist(), getattr(dist.init_process_group, MARK, None),
                       dist.init_process_group.__wrapped__.__module__]
        dist.destroy_process_group()
        # 2. get_torch_device() is torch.cpu and answers verl's memory queries
        device = get_torch_device()
        from verl.utils.memory_utils import aggressive_empty_cache
        aggressive_empty_cache(force_sync=True)
        out["memory"] = [device is torch.cpu, device.memory_allocated(), device.memory_reserved(),
                         device.max_memory_allocated(), device.max_memory_reserved(), device.empty_cache()]
        # 3. ServerArgs without a device
        out["device"] = [server_args.get_device(), getattr(server_args.get_device, MARK, None),
                         inspect.signature(server_args.get_device.__wrapped__).parameters.__len__()]
        # 4. + 5. the sharing strategy; sglang's reduction hook on a CPU tensor
        patch_torch.monkey_patch_torch_reductions()
        out["strategy"] = torch.multiprocessing.get_sharing_strategy()
        out["reduce"] = getattr(patch_torch._reduce_tensor_modified, MARK, None)
        # applying again (install() re-applies to the imported targets) changes nothing
        before = [dist.init_process_group, torch.cpu.memory_allocated, server_args.get_device,
                  patch_torch._reduce_tensor_modified, torch.multiprocessing.reductions.reduce_tensor]
        import verl_cpu.hook
        verl_cpu.hook.install(); verl_cpu.hook.install()
        after = [dist.init_process_group, torch.cpu.memory_allocated, server_args.get_device,
                 patch_torch._reduce_tensor_modified, torch.multiprocessing.reductions.reduce_tensor]
        out["idempotent"] = all(a is b for a, b in zip(before, after)) and out["hook"] == 1
        out["finders"] = sum(type(f).__name__ == "PatchFinder" for f in sys.meta_path)
        print(json.dumps(out))
        """,
        switch=True,
    )
    assert out["hook"] == 1 and out["finders"] == 1 and out["idempotent"]
    assert out["dist"] == [
        "cpu:gloo,cpu:nccl",
        "gloo",
        [1.0, 1.0, 1.0],
        "dist_backend",
        "torch.distributed.distributed_c10d",
    ]
    assert out["memory"] == [True, 0, 0, 0, 0, None]
    assert out["device"] == ["cpu", "sglang_device", 1]
    assert out["strategy"] == "file_system"
    assert out["reduce"] == "sglang_reduce"


@current_only
def test_hook_registers_the_cpu_platform_and_applies_every_patch_on_verl_0_9_1():
    """verl 0.9.1 with the switch on and ``VERL_PLATFORM=cpu``: every device question verl asks is answered for CPU,
    verl's own process-group helper gives a working gloo group, and the sglang patches are in place."""
    out = _run(
        """
        import json, os, socket, sys
        import torch, torch.distributed as dist
        import sglang.srt.server_args as server_args  # -> sglang_device
        import sglang.srt.utils.common as common  # -> sharing_strategy
        import sglang.srt.utils.patch_torch as patch_torch  # -> sglang_reduce
        from verl.plugin.platform import get_platform
        from verl.utils import device
        from verl.utils.distributed import initialize_global_process_group_ray  # -> dist_backend
        from verl.utils.memory_utils import aggressive_empty_cache

        MARK = "__treetune_verl_cpu_patch__"
        out = {"platform": [type(get_platform()).__name__, getattr(type(get_platform()), MARK, None)]}
        out["device"] = [device.get_device_name(), device.get_nccl_backend(), device.get_device_id(),
                         device.get_torch_device() is torch.cpu, device.get_resource_name(),
                         get_platform().ray_resource_options(1)]
        aggressive_empty_cache(force_sync=True)
        out["memory"] = [torch.cpu.memory_allocated(), torch.cpu.max_memory_reserved()]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", DIST_INIT_METHOD=f"tcp://127.0.0.1:{port}")
        initialize_global_process_group_ray(timeout_second=60)  # verl's string: cpu:gloo,cpu:gloo
        t = torch.ones(2); dist.all_reduce(t)
        out["dist"] = [dist.get_backend(), t.tolist(), getattr(dist.init_process_group, MARK, None)]
        dist.destroy_process_group()
        patch_torch.monkey_patch_torch_reductions()
        out["sglang"] = [server_args.get_device(), torch.multiprocessing.get_sharing_strategy(),
                         getattr(patch_torch._reduce_tensor_modified, MARK, None)]
        before = [dist.init_process_group, server_args.get_device, patch_torch._reduce_tensor_modified,
                  type(get_platform())]
        import verl_cpu.hook
        verl_cpu.hook.install(); verl_cpu.hook.install()
        from verl.plugin.platform.platform_manager import PlatformRegistry
        after = [dist.init_process_group, server_args.get_device, patch_torch._reduce_tensor_modified,
                 PlatformRegistry.get("cpu")]
        out["idempotent"] = all(a is b for a, b in zip(before, after))
        out["finders"] = sum(type(f).__name__ == "PatchFinder" for f in sys.meta_path)
        print(json.dumps(out))
        """,
        switch=True,
        VERL_PLATFORM="cpu",
    )
    assert out == {
        "platform": ["PlatformCPU", "cpu_platform"],
        "device": ["cpu", "gloo", "cpu", True, "CPU", {}],
        "memory": [0, 0],
        "dist": ["gloo", [1.0, 1.0], "dist_backend"],
        "sglang": ["cpu", "file_system", "sglang_reduce"],
        "idempotent": True,
        "finders": 1,
    }


@current_only
def test_the_cpu_platform_is_never_auto_detected():
    """Registered by the patch but chosen only by ``VERL_PLATFORM=cpu``: without it verl keeps its own fallback."""
    out = _run(
        """
        import json
        from verl.plugin.platform.platform_manager import PlatformRegistry, _detect_platform_name
        print(json.dumps([PlatformRegistry.get("cpu").__name__, _detect_platform_name()]))
        """,
        switch=True,
    )
    assert out == ["PlatformCPU", "nvidia"]


@current_only
def test_cpu_platform_refuses_a_cpu_platform_it_did_not_register(monkeypatch):
    from verl.plugin.platform import platform_manager
    from verl_cpu import cpu_platform

    class Other(platform_manager.PlatformBase):
        pass

    monkeypatch.setitem(platform_manager.PlatformRegistry._platforms, "cpu", Other)
    with pytest.raises(PatchError, match="already has a 'cpu' platform"):
        cpu_platform.apply(platform_manager)


def test_cpu_tensor_round_trips_through_sglang_serializer_between_unrelated_processes():
    """The weight-sync path: ``MultiprocessingSerializer`` with sglang's reduction hook, a CPU tensor, a receiver that
    is not the sender's child (as the scheduler is not the FSDP worker's). Unpatched: IndexError; patched: equal."""
    out = _run(
        """
        import json, os, subprocess, sys
        import torch
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

        monkey_patch_torch_reductions()  # what sglang's weight sync does before serializing
        tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
        try:
            MultiprocessingSerializer.serialize(tensor)
            unpatched = "no error"
        except IndexError as error:
            unpatched = f"IndexError: {error}"

        import sglang.srt.utils.common, sglang.srt.utils.patch_torch
        from verl_cpu import sglang_reduce, sharing_strategy
        sglang_reduce.apply(sglang.srt.utils.patch_torch)
        sharing_strategy.apply(sglang.srt.utils.common)
        payload = MultiprocessingSerializer.serialize([("w", tensor)], output_str=True)
        receiver = '''
        import sys, torch
        from sglang.srt.utils import MultiprocessingSerializer
        [(name, t)] = MultiprocessingSerializer.deserialize(sys.stdin.read())
        print(name, t.dtype, list(t.shape), repr(t.sum().item()), t.is_shared())
        '''
        env = {k: v for k, v in os.environ.items() if k != "TREETUNE_VERL_CPU_PATCHES"}
        got = subprocess.run([sys.executable, "-c", receiver], input=payload, env=env, capture_output=True,
                             text=True, timeout=240, start_new_session=True)
        print(json.dumps({"unpatched": unpatched, "rc": got.returncode, "received": got.stdout.strip(),
                          "expected": f"w torch.float32 [3, 4] {tensor.sum().item()!r} True",
                          "stderr": got.stderr[-2000:]}))
        """,
        switch=False,
    )
    assert out["unpatched"].startswith("IndexError"), out
    assert out["rc"] == 0, out["stderr"]
    assert out["received"] == out["expected"]


@pytest.mark.parametrize(
    "patch, attribute, stand_in",
    [
        ("dist_backend", None, None),
        ("sglang_device", "get_device", lambda device_id, extra=None: "cpu"),
        ("sglang_reduce", "_reduce_tensor_modified", lambda tensor: None),
        ("torch_cpu_memory", "get_torch_device", lambda name: None),
    ],
)
def test_guard_refuses_a_changed_signature(monkeypatch, patch, attribute, stand_in):
    module = importlib.import_module(target_of(patch))
    if patch == "dist_backend":  # the replaced function lives in torch.distributed
        import torch.distributed

        monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, world: None)
    else:
        monkeypatch.setattr(module, attribute, stand_in)
    with pytest.raises(PatchError, match="parameters .* the patch was written for"):
        importlib.import_module(f"verl_cpu.{patch}").apply(module)


def test_guard_refuses_a_changed_serializer(monkeypatch):
    import sglang.srt.utils.common as common
    import torch.multiprocessing

    class Serializer:
        @staticmethod
        def serialize(obj, output_str=False, protocol=None):
            return b""

        deserialize = common.MultiprocessingSerializer.deserialize

    monkeypatch.setattr(common, "MultiprocessingSerializer", Serializer)
    with pytest.raises(PatchError, match="MultiprocessingSerializer.serialize"):
        importlib.import_module("verl_cpu.sharing_strategy").apply(common)
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"


@pytest.mark.parametrize("patch", PATCH_MODULES)
def test_guard_refuses_another_version(monkeypatch, patch):
    from verl_cpu import _guard

    module = importlib.import_module(patch)
    monkeypatch.setattr(_guard.importlib.metadata, "version", lambda name: "0.0.1")
    with pytest.raises(PatchError, match="written for .* but .* 0.0.1 is installed"):
        module.apply(importlib.import_module(target_of(patch)))


def test_each_patch_module_names_its_upstream_and_versions():
    for name in PATCH_MODULES:
        module = importlib.import_module(name)
        assert module.SUPPORTED and name.rsplit(".", 1)[1] == module.PATCH
        assert "Upstream:" in module.__doc__


def test_dist_backend_rewrites_only_verls_cpu_string():
    from verl_cpu.dist_backend import cpu_backend

    assert cpu_backend("cpu:gloo,cpu:nccl") == "gloo"
    assert cpu_backend("cpu:gloo,cpu:hccl") == "gloo"
    assert cpu_backend("cpu:gloo,cpu:gloo") == "gloo"  # verl 0.9.1 on the cpu platform
    for unchanged in ("cpu:gloo,cuda:nccl", "gloo", "nccl", None, "cpu:gloo"):
        assert cpu_backend(unchanged) == unchanged


def test_marks_are_set_on_stand_ins():
    from verl_cpu import torch_cpu_memory

    assert all(getattr(f, MARK) == "torch_cpu_memory" for f in torch_cpu_memory.STAND_INS)


def test_offload_pin_memory_lets_verl_build_an_offloaded_fsdp2_model_on_cpu():
    """The reference model's path: verl's ``fsdp2_load_full_state_dict`` on an FSDP2 module with the offload policy
    verl builds it with (0.7.1: ``fsdp_workers``; 0.9.1: the FSDP engine's module). torch's ``CPUOffloadPolicy(pin_memory=True)`` fails on CPU; the patched name
    gives ``pin_memory=False``, is still torch's class, and the sharded model computes what the plain one does."""
    out = _run(
        """
        import datetime, json, socket
        import torch, torch.distributed as dist
        import importlib
        fsdp_workers = importlib.import_module("BUILDER_MODULE")  # -> offload_pin_memory
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy as TorchPolicy, fully_shard
        from verl.utils.fsdp_utils import fsdp2_load_full_state_dict

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group(backend="gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}",
                                timeout=datetime.timedelta(seconds=60))
        mesh = init_device_mesh("cpu", (1,))

        def model():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

        def build(policy):
            m = model(); full = m.state_dict()
            for layer in (m[0], m[2]):
                fully_shard(layer, mesh=mesh, offload_policy=policy)
            fully_shard(m, mesh=mesh, offload_policy=policy)
            fsdp2_load_full_state_dict(m, full, mesh, policy)
            return m

        try:
            build(TorchPolicy(pin_memory=True)); unpatched = "no error"
        except RuntimeError as error:
            unpatched = str(error)
        policy = fsdp_workers.CPUOffloadPolicy(pin_memory=True)  # what _build_model_optimizer asks for the ref
        x = torch.linspace(-1, 1, 12).reshape(3, 4)
        with torch.no_grad():
            got, expected = build(policy)(x), model()(x)
        before = fsdp_workers.CPUOffloadPolicy
        import verl_cpu.hook
        verl_cpu.hook.install()
        print(json.dumps({
            "unpatched": unpatched, "pin_memory": policy.pin_memory, "isinstance": isinstance(policy, TorchPolicy),
            "mark": getattr(fsdp_workers.CPUOffloadPolicy, "__treetune_verl_cpu_patch__", None),
            "wrapped": fsdp_workers.CPUOffloadPolicy.__wrapped__ is TorchPolicy,
            "equal": torch.allclose(got, expected, atol=1e-6), "idempotent": fsdp_workers.CPUOffloadPolicy is before,
        }))
        dist.destroy_process_group()
        """.replace("BUILDER_MODULE", OFFLOAD_BUILDER[0]),
        switch=True,
        VERL_PLATFORM="cpu",  # verl 0.9.1's fsdp_utils asks the platform for the device (the e2e script sets it)
    )
    assert "Cannot access accelerator device when none is available" in out.pop("unpatched")
    assert out == {
        "pin_memory": False,
        "isinstance": True,
        "mark": "offload_pin_memory",
        "wrapped": True,
        "equal": True,
        "idempotent": True,
    }


def test_offload_pin_memory_guards(monkeypatch):
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl_cpu import offload_pin_memory

    module, owner, method = OFFLOAD_BUILDER
    fsdp_workers = importlib.import_module(module)

    class Policy:
        def __init__(self, pin_memory=True):
            self.pin_memory = pin_memory

    monkeypatch.setattr(fsdp_workers, "CPUOffloadPolicy", Policy)
    with pytest.raises(PatchError, match="not torch's"):
        offload_pin_memory.apply(fsdp_workers)
    assert fsdp_workers.CPUOffloadPolicy is Policy
    monkeypatch.setattr(fsdp_workers, "CPUOffloadPolicy", CPUOffloadPolicy)
    monkeypatch.setattr(getattr(fsdp_workers, owner), method, lambda self, model_path: None)
    with pytest.raises(PatchError, match="parameters .* the patch was written for"):
        offload_pin_memory.apply(fsdp_workers)
    assert fsdp_workers.CPUOffloadPolicy is CPUOffloadPolicy
