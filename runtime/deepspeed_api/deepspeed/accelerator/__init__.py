"""``deepspeed.accelerator.get_accelerator()``: the device the runtime trains on, with the calls
scripts make on it and the meaning DeepSpeed's own accelerator gives each on that device.

CUDA when torch sees a GPU, else the CPU (the runtime's own choice of device). On the CPU the
device calls are DeepSpeed's CPU accelerator's: ``set_device`` and ``synchronize`` do nothing,
``device_name`` is ``"cpu"`` whatever the index, the random-number calls are torch's, memory is
the process's resident size. On CUDA each is the ``torch.cuda`` call of the same name. What is
not here (op builders, the compiled kernels) raises `NotInBundledRuntime` naming the call.
"""

from __future__ import annotations

import contextlib
import os

import torch

from .._missing import missing, module_getattr

__all__ = ["get_accelerator", "is_current_accelerator_supported"]


def _rss() -> int:
    """This process's resident memory in bytes (what DeepSpeed's CPU accelerator reports as
    memory allocated), read from /proc without psutil."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Accelerator:
    """One object per process, as DeepSpeed's ``get_accelerator()`` returns."""

    def __init__(self) -> None:
        self._name = "cuda" if torch.cuda.is_available() else "cpu"
        self._communication_backend_name = "nccl" if self._name == "cuda" else "gloo"
        self._compile_backend = "inductor"
        self._max_rss = _rss() if self._name == "cpu" else 0

    @property
    def _cuda(self) -> bool:
        return self._name == "cuda"

    # ---- what the device is
    def is_synchronized_device(self) -> bool:
        """True on the CPU: work is done when the call returns (no streams)."""
        return not self._cuda

    def use_host_timers(self) -> bool:
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        return self.is_synchronized_device()

    def is_available(self) -> bool:
        return True

    def communication_backend_name(self) -> str:
        return self._communication_backend_name

    def get_compile_backend(self) -> str:
        return self._compile_backend

    def is_bf16_supported(self) -> bool:
        return not self._cuda or torch.cuda.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        """fp16 training needs a GPU here (the runtime's fp16 does not run on the CPU)."""
        return self._cuda

    def supported_dtypes(self) -> list[torch.dtype]:
        dtypes = [torch.float]
        if self.is_fp16_supported():
            dtypes.append(torch.half)
        if self.is_bf16_supported():
            dtypes.append(torch.bfloat16)
        return dtypes

    def is_triton_supported(self) -> bool:
        return self._cuda and torch.cuda.get_device_capability()[0] >= 8

    # ---- devices
    def device_name(self, device_index: int | None = None) -> str:
        if not self._cuda or device_index is None:
            return self._name
        return f"cuda:{device_index}"

    def device(self, device_index: int | None = None):
        """``torch.cuda.device(index)`` on CUDA; None on the CPU, as DeepSpeed's."""
        return torch.cuda.device(device_index) if self._cuda else None

    def set_device(self, device_index) -> None:
        """Make ``device_index`` this process's GPU; nothing to do on the CPU."""
        if self._cuda:
            torch.cuda.set_device(device_index)

    def current_device(self) -> int:
        if self._cuda:
            return torch.cuda.current_device()
        return int(os.environ.get("LOCAL_RANK", "0"))  # DeepSpeed's CPU: the local rank

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}" if self._cuda else "cpu"

    def device_count(self) -> int:
        if self._cuda:
            return torch.cuda.device_count()
        return int(os.environ.get("LOCAL_SIZE", "0")) or 1

    def synchronize(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.synchronize(device_index)

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return str(tensor.device).startswith(self._name)

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:  # noqa: ARG002
        """Page-locked on CUDA; the tensor itself on the CPU (nothing to pin to)."""
        return tensor.pin_memory() if self._cuda else tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned() if self._cuda else False

    def lazy_call(self, callback):
        if self._cuda:
            return torch.cuda._lazy_call(callback)
        return callback()

    def export_envs(self) -> list[str]:
        return ["NCCL"] if self._cuda else []

    def visible_devices_envs(self) -> list[str]:
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, current_env: dict, local_accelerator_ids) -> None:
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def amp(self):
        return torch.cuda.amp if self._cuda else torch.cpu.amp

    # ---- random numbers
    def random(self):
        return torch.random

    def manual_seed(self, seed: int):
        """Seed this device's generator (CUDA: the current GPU's; CPU: torch's)."""
        return torch.cuda.manual_seed(seed) if self._cuda else torch.manual_seed(seed)

    def manual_seed_all(self, seed: int):
        return torch.cuda.manual_seed_all(seed) if self._cuda else torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed() if self._cuda else torch.initial_seed()

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        if self._cuda:
            return torch.cuda.get_rng_state("cuda" if device_index is None else device_index)
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.set_rng_state(new_state, "cuda" if device_index is None else device_index)
        else:
            torch.set_rng_state(new_state)

    def default_generator(self, device_index: int):
        return (
            torch.cuda.default_generators[device_index] if self._cuda else torch.default_generator
        )

    # ---- streams and events: none on the CPU
    @property
    def Stream(self):  # noqa: N802 - DeepSpeed's name
        return torch.cuda.Stream if self._cuda else None

    def stream(self, stream):
        return torch.cuda.stream(stream) if self._cuda else contextlib.nullcontext()

    def current_stream(self, device_index: int | None = None):
        return torch.cuda.current_stream(device_index) if self._cuda else None

    def default_stream(self, device_index: int | None = None):
        return torch.cuda.default_stream(device_index) if self._cuda else None

    @property
    def Event(self):  # noqa: N802 - DeepSpeed's name
        if self._cuda:
            return torch.cuda.Event
        raise missing("deepspeed.accelerator.get_accelerator().Event", "no events on the CPU")

    def range_push(self, msg: str, domain=None, category=None) -> None:  # noqa: ARG002
        if self._cuda:
            torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain=None) -> None:  # noqa: ARG002
        if self._cuda:
            torch.cuda.nvtx.range_pop()

    # ---- memory: torch.cuda's counters; on the CPU the process's resident size
    def empty_cache(self) -> None:
        if self._cuda:
            torch.cuda.empty_cache()

    def _cpu_rss(self) -> int:
        now = _rss()
        self._max_rss = max(self._max_rss, now)
        return now

    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index) if self._cuda else self._cpu_rss()

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        if self._cuda:
            return torch.cuda.max_memory_allocated(device_index)
        self._cpu_rss()
        return self._max_rss

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(device_index)
        else:
            self._max_rss = _rss()

    reset_peak_memory_stats = reset_max_memory_allocated

    def memory_reserved(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_reserved(device_index) if self._cuda else self._cpu_rss()

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        if self._cuda:
            return torch.cuda.max_memory_reserved(device_index)
        self._cpu_rss()
        return self._max_rss

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    def memory_stats(self, device_index: int | None = None) -> dict:
        if self._cuda:
            return torch.cuda.memory_stats(device_index)
        now = self._cpu_rss()
        return {"allocated_bytes.all.current": now, "allocated_bytes.all.peak": self._max_rss}

    def total_memory(self, device_index: int | None = None) -> int:
        if self._cuda:
            return torch.cuda.get_device_properties(device_index or 0).total_memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def available_memory(self, device_index: int | None = None) -> int:
        if self._cuda:
            free, _ = torch.cuda.mem_get_info(device_index)
            return free
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise missing(f"deepspeed.accelerator.get_accelerator().{name}")


_ACCELERATOR: _Accelerator | None = None


def get_accelerator() -> _Accelerator:
    global _ACCELERATOR
    if _ACCELERATOR is None:
        _ACCELERATOR = _Accelerator()
    return _ACCELERATOR


def is_current_accelerator_supported() -> bool:
    return True


__getattr__ = module_getattr(__name__)
