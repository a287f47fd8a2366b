"""``deepspeed.comm``: the runtime's script-facing collectives (`runtime.dist`)."""

from __future__ import annotations

from runtime.dist import *  # noqa: F403 - this module is runtime.dist under DeepSpeed's name
from runtime.dist import __all__ as _dist_all

from .._missing import module_getattr

__all__ = list(_dist_all)
__getattr__ = module_getattr("deepspeed.comm")
