"""``deepspeed.accelerator.real_accelerator``: where DeepSpeed defines `get_accelerator` (Megatron
and DeepSpeed's examples import it from here)."""

from __future__ import annotations

from .._missing import module_getattr
from . import get_accelerator, is_current_accelerator_supported

__all__ = ["get_accelerator", "is_current_accelerator_supported"]
__getattr__ = module_getattr(__name__)
