"""``deepspeed.launcher``: the names accelerate reads from DeepSpeed's launcher."""

from __future__ import annotations

from .._missing import module_getattr
from . import runner

__all__ = ["runner"]
__getattr__ = module_getattr(__name__)
