"""``deepspeed.accelerator.get_accelerator()``: the device the runtime trains on, with the
calls transformers and accelerate make on it."""

from __future__ import annotations

import os

import torch

from .._missing import module_getattr

__all__ = ["get_accelerator"]


class _Accelerator:
    """CUDA when torch sees a GPU, else the CPU (the runtime's own choice of device)."""

    def __init__(self) -> None:
        self._name = "cuda" if torch.cuda.is_available() else "cpu"

    def device_name(self, device_index: int | None = None) -> str:
        if self._name == "cpu" or device_index is None:
            return self._name
        return f"{self._name}:{device_index}"

    def current_device_name(self) -> str:
        if self._name == "cpu":
            return "cpu"
        return f"cuda:{torch.cuda.current_device()}"

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._name == "cuda" else 0

    def device_count(self) -> int:
        return torch.cuda.device_count() if self._name == "cuda" else 1

    def communication_backend_name(self) -> str:
        return "nccl" if self._name == "cuda" else "gloo"

    def is_available(self) -> bool:
        return True

    def is_bf16_supported(self) -> bool:
        return self._name == "cpu" or torch.cuda.is_bf16_supported()

    def is_fp16_supported(self) -> bool:
        return self._name == "cuda"

    def synchronize(self, device_index: int | None = None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def empty_cache(self) -> None:
        if self._name == "cuda":
            torch.cuda.empty_cache()

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        from .._missing import missing

        raise missing(f"deepspeed.accelerator.get_accelerator().{name}")


_ACCELERATOR: _Accelerator | None = None


def get_accelerator() -> _Accelerator:
    global _ACCELERATOR
    if _ACCELERATOR is None:
        _ACCELERATOR = _Accelerator()
    return _ACCELERATOR


__getattr__ = module_getattr("deepspeed.accelerator")
