"""Sharded checkpoints: one safetensors shard per rank, a JSON manifest, nothing pickled.

A checkpoint stores every trained parameter by name and element range, so it loads at any
world size and any ZeRO stage, and consolidates into one state dict without the engine:

* `storage` writes shards and the manifest with an atomic commit (`write_checkpoint`);
* `reader` validates a checkpoint and reads exact ranges (`CheckpointReader`);
* `engine_io` maps an engine's owned state to pieces (`save_engine`, `load_engine`);
* `consolidate` builds a full state dict (`consolidate_state_dict`).

torch is imported by the submodules, on first use.
"""

from __future__ import annotations

from .errors import CheckpointError

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "consolidate_state_dict",
    "CheckpointReader",
]


def save_checkpoint(
    engine,
    save_dir=None,
    tag=None,
    client_state=None,
    save_latest=True,
    exclude_frozen_parameters=False,
):
    from .engine_io import save_engine

    return save_engine(engine, save_dir, tag, client_state, save_latest, exclude_frozen_parameters)


def load_checkpoint(engine, load_dir=None, tag=None, **options):
    from .engine_io import load_engine

    return load_engine(engine, load_dir, tag, **options)


def consolidate_state_dict(checkpoint_dir, tag=None, dtype=None):
    from .consolidate import consolidate_state_dict as run

    return run(checkpoint_dir, tag, dtype)


def __getattr__(name: str):
    if name == "CheckpointReader":
        from .reader import CheckpointReader

        return CheckpointReader
    raise AttributeError(f"module 'runtime.checkpoint' has no attribute {name!r}")
