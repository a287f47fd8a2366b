"""Activation checkpointing with DeepSpeed's API (``deepspeed.checkpointing``).

Megatron-style models call ``checkpoint(block, hidden, mask)`` around each transformer block:
the block's activations are dropped after forward and recomputed in backward, so only the
block inputs are held in between. ``runtime.initialize`` configures this module from the
config's ``activation_checkpointing`` block (and the ``mpu`` it is given); a script may call
`configure` itself, as Megatron-DeepSpeed does. The options (see `CheckpointOptions`):

* ``partition_activations``: each model-parallel rank keeps 1/N of every block input
  (tensor-parallel ranks compute identical ones), all-gathered before recomputation;
* ``cpu_checkpointing``: block inputs wait in host memory (pinned, async copies on CUDA);
* ``contiguous_memory_optimization`` + ``number_checkpoints``: they wait in one preallocated
  buffer of ``number_checkpoints`` slots, reused every step;
* ``synchronize_checkpoint_boundary``: the device is synchronized at every checkpoint's
  forward and backward boundaries;
* ``profile``: forward and recomputation times are summed and reported with the step
  metrics (`take_profile`).

Recomputation replays the CPU, device and tracker RNG states of the forward
(`rng.RNGSnapshot`): with dropout, gradients equal those of the model run without
checkpointing. The tracker (`get_cuda_rng_tracker`, `model_parallel_cuda_manual_seed`) is
device-neutral: without CUDA it tracks CPU generator states.
"""

from __future__ import annotations

# The face is checkpointing.py's list (DeepSpeed's deepspeed.checkpointing names, the RNG
# tracker's and the stash's among them): one list of names, there.
from runtime.activation_checkpointing import checkpointing
from runtime.activation_checkpointing.checkpointing import *  # noqa: F403

__all__ = [*checkpointing.__all__]
