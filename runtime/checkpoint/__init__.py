"""Sharded checkpoints: one safetensors shard per rank, a JSON manifest, nothing pickled.

A checkpoint stores every trained parameter by name and element range, so it loads at any
world size and any ZeRO stage, and consolidates into one state dict without the engine:

* `storage` writes shards and the manifest with an atomic commit (`write_checkpoint`);
* `reader` validates a checkpoint and reads exact ranges (`CheckpointReader`);
* `engine_io` saves and loads an engine (`save_engine`, `load_engine`) through its parts'
  state: `pieces`, `optimizer_state`, `module_state`, `rng`;
* `preempt` applies zlaunch's --resume and --save-on inside a worker;
* `consolidate` builds a full state dict (`consolidate_state_dict`).

torch is imported by the submodules, on first use.
"""

from __future__ import annotations

from .errors import CheckpointError

__all__ = [
    "CheckpointError",
    "consolidate_state_dict",
    "CheckpointReader",
]


def consolidate_state_dict(checkpoint_dir, tag=None, dtype=None):
    from .consolidate import consolidate_state_dict as run

    return run(checkpoint_dir, tag, dtype)


def __getattr__(name: str):
    if name == "CheckpointReader":
        from .reader import CheckpointReader

        return CheckpointReader
    raise AttributeError(f"module 'runtime.checkpoint' has no attribute {name!r}")
