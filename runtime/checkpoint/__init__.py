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

__all__ = [
    "AsyncSaver",
    "CheckpointError",
    "CheckpointReader",
    "LoadRequest",
    "SaveRequest",
    "consolidate_state_dict",
    "load_engine",
    "resume_from_env",
    "save_16bit_model",
    "save_engine",
    "save_on_signal_from_env",
    "write_state_dict",
]


def __getattr__(name: str):
    # Each name loads with its module on first use: importing this folder (and
    # `import runtime`, which the controller does to check a config) stays light.
    if name in ("AsyncSaver",):
        from runtime.checkpoint import async_save

        return getattr(async_save, name)
    if name in ("consolidate_state_dict", "write_state_dict"):
        from runtime.checkpoint import consolidate

        return getattr(consolidate, name)
    if name in ("LoadRequest", "SaveRequest", "load_engine", "save_16bit_model", "save_engine"):
        from runtime.checkpoint import engine_io

        return getattr(engine_io, name)
    if name in ("CheckpointError",):
        from runtime.checkpoint import errors

        return getattr(errors, name)
    if name in ("resume_from_env", "save_on_signal_from_env"):
        from runtime.checkpoint import preempt

        return getattr(preempt, name)
    if name in ("CheckpointReader",):
        from runtime.checkpoint import reader

        return getattr(reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
