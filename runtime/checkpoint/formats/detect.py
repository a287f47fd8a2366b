"""Which format a checkpoint directory holds, and the reader that opens it."""

from __future__ import annotations

import os

from runtime.checkpoint.errors import CheckpointError
from runtime.checkpoint.storage import MANIFEST, read_latest, resolve_checkpoint, validate_tag

__all__ = [
    "NATIVE",
    "DEEPSPEED",
    "detect_format",
    "open_checkpoint",
    "resolve",
    "locate",
    "refuse_foreign_under_mpu",
]

NATIVE = "zlaunch"
DEEPSPEED = "deepspeed"


def detect_format(path: str) -> str | None:
    """The format of the checkpoint tag folder ``path``, or None."""
    from .deepspeed import is_deepspeed_checkpoint

    if os.path.isfile(os.path.join(path, MANIFEST)):
        return NATIVE
    if is_deepspeed_checkpoint(path):
        return DEEPSPEED
    return None


def open_checkpoint(path: str):
    """A reader of the checkpoint in ``path``, whatever its format (validated)."""
    if detect_format(path) == DEEPSPEED:
        from .deepspeed import DeepSpeedReader

        return DeepSpeedReader(path)
    from runtime.checkpoint.reader import CheckpointReader

    return CheckpointReader(path)


def _named_tag(load_dir: str, tag: str | None) -> str | None:
    if tag is not None:
        return os.path.join(load_dir, validate_tag(str(tag)))
    # A small regular file, or a CheckpointError naming it: never a FIFO waited on, a device
    # read until memory runs out, or a file elsewhere read through a link.
    name = read_latest(load_dir)
    return os.path.join(load_dir, name) if name is not None else None


def resolve(load_dir: str, tag: str | None) -> str | None:
    """Like `storage.resolve_checkpoint` (the folder of ``tag``, default ``latest``'s; None
    when there is no ``latest``), for a checkpoint of any format."""
    load_dir = os.path.abspath(load_dir)
    named = _named_tag(load_dir, tag)
    if named is not None and os.path.isdir(named) and detect_format(named) == DEEPSPEED:
        return named
    return resolve_checkpoint(load_dir, tag)


def locate(checkpoint_dir: str, tag: str | None = None) -> str:
    """A tag folder given directly, or the tag (default ``latest``) of a save folder."""
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointError(f"{checkpoint_dir} is not a directory")
    if tag is None and detect_format(checkpoint_dir) is not None:
        return os.path.abspath(checkpoint_dir)
    path = resolve(checkpoint_dir, tag)
    if path is None:
        raise CheckpointError(
            f"{checkpoint_dir} holds no checkpoint: no 'latest' file, no {MANIFEST} and no "
            "DeepSpeed model-states file; give --tag or the folder of one checkpoint"
        )
    return path


def refuse_foreign_under_mpu(load_dir: str | None, tag: str | None) -> None:
    """With an mpu each rank loads its ``mp_rank_NN/`` part of a native checkpoint; a DeepSpeed
    checkpoint keeps its tensor-parallel parts side by side, which is not read here. Say so
    instead of finding no ``latest`` under ``mp_rank_NN/`` and loading nothing."""
    if not load_dir:
        return
    named = _named_tag(os.path.abspath(str(load_dir)), tag)
    if named is not None and detect_format(named) == DEEPSPEED:
        raise CheckpointError(
            f"{named} is a DeepSpeed checkpoint; with model parallelism (an mpu) only this "
            "runtime's checkpoints are loaded (DeepSpeed's tensor-parallel parts are not "
            "resharded here); load it without an mpu, or convert the model's weights"
        )
