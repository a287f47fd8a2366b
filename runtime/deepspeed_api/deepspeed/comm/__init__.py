"""``deepspeed.comm``: the runtime's script-facing collectives (`runtime.distributed.script_comm`)."""

from __future__ import annotations

from runtime.distributed.script_comm import *  # noqa: F403 - this module is runtime.distributed.script_comm under DeepSpeed's name
from runtime.distributed.script_comm import __all__ as _dist_all

from .._missing import module_getattr

__all__ = list(_dist_all)
__getattr__ = module_getattr(__name__)
