"""Checkpoint formats: which one a folder holds, and a reader for it.

Every reader answers the engine's questions the same way (`shapes`, `kinds`,
``read(name, kind, lo, hi)``, ``state(key)``, `extra`, ``rank_state(rank)``), so a foreign
checkpoint is loaded and resharded exactly as the runtime's own:

* the runtime's own (``manifest.json`` + safetensors shards): `CheckpointReader`;
* DeepSpeed's ZeRO checkpoints (``mp_rank_00_model_states.pt``, ``*_optim_states.pt``):
  `deepspeed.DeepSpeedReader`.
"""

from __future__ import annotations

from runtime.checkpoint.formats.detect import (
    DEEPSPEED,
    NATIVE,
    detect_format,
    locate,
    open_checkpoint,
    refuse_foreign_under_mpu,
    resolve,
)

__all__ = [
    "DEEPSPEED",
    "NATIVE",
    "detect_format",
    "locate",
    "open_checkpoint",
    "refuse_foreign_under_mpu",
    "resolve",
]
