"""``runtime.checkpointing``: the name DeepSpeed users know (``deepspeed.checkpointing``) for
activation checkpointing, which lives in `runtime.activation_checkpointing`. The same module
object, so ``configure`` here configures what the model's ``checkpoint`` calls use."""

import sys

from runtime import activation_checkpointing

sys.modules[__name__] = activation_checkpointing
