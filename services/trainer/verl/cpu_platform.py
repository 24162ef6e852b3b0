"""verl on a machine without an accelerator: a platform plug-in that makes verl's own actor worker (FSDP2)
run on CPU over gloo, so the demo trains with the production step, not a copy of it.

Loaded by verl itself in every process (driver, task runner, workers) through its extension points:
`VERL_USE_EXTERNAL_MODULES=services.trainer.verl.cpu_platform` imports this module when verl is imported, and
`VERL_PLATFORM=cpu` selects the platform registered here. `ray_env.cpu_env()` gives both; the runner sets them.

What it does, each through verl's registries unless noted:
- registers platform "cpu": device "cpu", gloo, Ray resource "GPU" (the runner declares one logical "GPU"
  per CPU training rank, so verl's resource pools and placement groups work unchanged);
- registers verl's FSDP/FSDP2 language-model engine for device "cpu" (verl registers it for cuda/npu only);
- one patch, pinned to verl 0.9.1 (`VERL_VERSION`): `initialize_global_process_group_ray` builds the backend
  string "cpu:gloo,{device}:{backend}", which is "cpu:gloo,cpu:gloo" here and rejected by torch; on CPU the
  backend is plain "gloo". tests/trainer/test_cpu_platform.py fails if verl's function moves or changes.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

import torch
import verl
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from services.trainer.ray_env import PLATFORM_NAME

VERL_VERSION = "0.9.1"


class _CpuDeviceModule:
    """`torch.cpu`, completed with the `torch.cuda`-style calls verl makes on its device module (memory
    statistics, RNG state, device selection). Memory statistics report zero: CPU memory is not a pool."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    def memory_reserved(self, *args: Any, **kwargs: Any) -> int:
        return 0

    memory_allocated = max_memory_allocated = max_memory_reserved = memory_reserved

    def reset_peak_memory_stats(self, *args: Any, **kwargs: Any) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def mem_get_info(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        pages, page_size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * page_size, os.sysconf("SC_PHYS_PAGES") * page_size

    def current_device(self) -> str:
        return "cpu"

    def set_device(self, *args: Any, **kwargs: Any) -> None:
        return None

    def device_count(self) -> int:
        return 1

    def is_available(self) -> bool:
        return True

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def get_rng_state(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        torch.set_rng_state(state)

    def synchronize(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get_device_name(self, *args: Any, **kwargs: Any) -> str:
        return "CPU"


_DEVICE_MODULE = _CpuDeviceModule()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class CpuPlatform(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it, so a GPU machine is never demoted.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

    def current_device(self) -> Any:
        # verl writes `.to(get_device_id())` everywhere; "cpu" is a valid target there.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):  # type: ignore[no-untyped-def]
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _register_cpu_engines() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    backends = EngineRegistry._engines.get("language_model", {})
    if "cpu" not in backends.get("fsdp2", {}):
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
            FSDPEngineWithLMHead
        )


def _patch_process_group_backend() -> None:
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_agl_cpu", False):
        return

    def initialize_global_process_group_ray(timeout_second: Any = None, backend: str | None = None) -> Any:
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray._agl_cpu = True  # type: ignore[attr-defined]
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    # engine_workers imported the name before this module ran in some processes: rebind it there too.
    import verl.workers.engine_workers as engine_workers

    engine_workers.initialize_global_process_group_ray = initialize_global_process_group_ray


def _patch_reference_offload() -> None:
    """verl shards a forward-only model (the KL loss's reference) with CPUOffloadPolicy(pin_memory=True); pinning
    needs an accelerator ("Cannot access accelerator device when none is available"), and on CPU the weights are in
    host memory already: the same policy, unpinned."""
    import verl.workers.engine.fsdp.transformer_impl as transformer_impl

    original = transformer_impl.CPUOffloadPolicy
    if getattr(original, "_agl_cpu", False):
        return

    def unpinned(pin_memory: bool = True, **kwargs: Any) -> Any:
        del pin_memory
        return original(pin_memory=False, **kwargs)

    unpinned._agl_cpu = True  # type: ignore[attr-defined]
    transformer_impl.CPUOffloadPolicy = unpinned


def install() -> None:
    """Registers the CPU engine and applies the backend patch; refuses another verl version."""
    if verl.__version__ != VERL_VERSION:
        raise RuntimeError(
            f"services.trainer.verl.cpu_platform is written against verl {VERL_VERSION}, found {verl.__version__}"
        )
    _register_cpu_engines()
    _patch_process_group_backend()
    _patch_reference_offload()


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME:
    install()
