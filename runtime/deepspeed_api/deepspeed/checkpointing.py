"""``deepspeed.checkpointing``: activation checkpointing (`runtime.activation_checkpointing`)."""

from __future__ import annotations

from runtime.activation_checkpointing import *  # noqa: F403 - runtime.activation_checkpointing under DeepSpeed's name
from runtime.activation_checkpointing import __all__ as _all

from ._missing import module_getattr

__all__ = list(_all)
__getattr__ = module_getattr(__name__)
