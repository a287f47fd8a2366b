"""``deepspeed.checkpointing``: activation checkpointing (`runtime.activation_checkpointing`)."""

from __future__ import annotations

from runtime.activation_checkpointing import *  # noqa: F403 - runtime.activation_checkpointing under DeepSpeed's name
from runtime.activation_checkpointing import __all__ as _all
from runtime.activation_checkpointing import partition_activations_in_checkpoint, set_num_layers

from ._missing import module_getattr

__all__ = [*_all, "partition_activations_in_checkpoint", "set_num_layers"]
__getattr__ = module_getattr("deepspeed.checkpointing")
