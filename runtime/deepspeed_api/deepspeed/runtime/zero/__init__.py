"""``deepspeed.runtime.zero``: the ZeRO names imported by DeepSpeed's internal path."""

from __future__ import annotations

from runtime.zero import GatheredParameters, Init

from ..._missing import module_getattr
from . import partition_parameters

__all__ = ["GatheredParameters", "Init", "partition_parameters"]
__getattr__ = module_getattr(__name__)
