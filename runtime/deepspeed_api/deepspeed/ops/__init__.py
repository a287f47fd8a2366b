"""``deepspeed.ops``: DeepSpeed's optimizer kernels, as torch optimizers with their meaning."""

from __future__ import annotations

from .._missing import module_getattr
from . import adagrad, adam, lion

__all__ = ["adagrad", "adam", "lion"]
__getattr__ = module_getattr(__name__)
