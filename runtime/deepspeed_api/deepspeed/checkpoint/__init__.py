"""``deepspeed.checkpoint``: the helpers accelerate imports when saving."""

from __future__ import annotations

from .._missing import module_getattr
from . import utils

__all__ = ["utils"]
__getattr__ = module_getattr(__name__)
