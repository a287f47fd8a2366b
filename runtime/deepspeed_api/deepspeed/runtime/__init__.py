"""``deepspeed.runtime``: the engine, learning-rate schedules and ZeRO internals that the
Hugging Face integration imports by DeepSpeed's module paths."""

from __future__ import annotations

from .._missing import module_getattr
from . import dataloader, engine, lr_schedules, zero

__all__ = ["dataloader", "engine", "lr_schedules", "zero"]
__getattr__ = module_getattr(__name__)
