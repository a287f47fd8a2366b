"""One full state dict from a sharded checkpoint, without torch.distributed or the engine.

Every trained parameter is read whole (fp32 master weights) from the shards that hold it and
reshaped; tied names (``aliases``) get their own copy, so ``model.load_state_dict`` finds
every key it expects; buffers and frozen parameters come from rank 0's shard as saved.
"""

from __future__ import annotations

import os

import torch

from .errors import CheckpointError
from .held_dir import HeldDir, temp_name
from .reader import CheckpointReader
from .storage import MANIFEST, resolve_checkpoint

__all__ = ["consolidate_state_dict", "write_state_dict", "write_torch_state_dict", "DTYPES"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def locate(checkpoint_dir: str, tag: str | None) -> str:
    """A tag directory given directly, or the tag (default: ``latest``) under a save dir."""
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointError(f"{checkpoint_dir} is not a directory")
    if tag is None and os.path.isfile(os.path.join(checkpoint_dir, MANIFEST)):
        return os.path.abspath(checkpoint_dir)
    path = resolve_checkpoint(checkpoint_dir, tag)
    if path is None:
        raise CheckpointError(
            f"{checkpoint_dir} has no 'latest' file and no {MANIFEST}; give --tag or the "
            "directory of one checkpoint"
        )
    return path


def consolidate_state_dict(
    checkpoint_dir: str, tag: str | None = None, dtype: torch.dtype | None = None
) -> tuple[dict[str, torch.Tensor], str]:
    """(state dict, checkpoint path). Floating tensors are cast to ``dtype`` when given."""
    path = locate(checkpoint_dir, tag)
    out: dict[str, torch.Tensor] = {}
    with CheckpointReader(path) as reader:
        for name in reader.shapes:
            out[name] = reader.read_full(name, "param")
        for alias, name in (reader.state("aliases") or {}).items():
            if name not in out:
                raise CheckpointError(f"{reader.manifest_path}: alias {alias} of unknown {name}")
            out[alias] = out[name].clone()
        for name in reader.extra:
            out[name] = reader.read_extra(name)
    if dtype is not None:
        out = {k: v.to(dtype) if v.is_floating_point() else v for k, v in out.items()}
    return out, path


def write_state_dict(state: dict[str, torch.Tensor], output: str, metadata: dict) -> None:
    """Save as safetensors, streamed: a file of ours under a random temporary name in the
    output's folder (never through a link planted there), renamed over ``output`` once
    complete (no half-written output, an old file replaced whole)."""
    from .export import SafetensorsStream

    output = os.path.abspath(output)
    parent = os.path.dirname(output)
    if not os.path.isdir(parent):
        raise CheckpointError(f"cannot write {output}: {parent} is not a directory")
    plan = [(name, tuple(t.shape), t.dtype) for name, t in state.items()]
    try:
        with HeldDir.open(parent) as folder:
            with SafetensorsStream(folder, os.path.basename(output), plan, metadata) as out:
                for name, t in state.items():
                    out.write(name, t)
    except OSError as err:
        raise CheckpointError(f"cannot write {output}: {err.strerror or err}") from None


def write_torch_state_dict(state: dict[str, torch.Tensor], output: str) -> None:
    """Save with ``torch.save`` (what ``torch.load`` and ``from_pretrained`` read from a
    ``.bin``), atomically as `write_state_dict` does: a new file of ours under a random
    temporary name in the output's folder, fsync'd, renamed over ``output`` once complete."""
    output = os.path.abspath(output)
    parent, name = os.path.split(output)
    if not os.path.isdir(parent):
        raise CheckpointError(f"cannot write {output}: {parent} is not a directory")
    tmp = temp_name(name)
    try:
        with HeldDir.open(parent) as folder:
            try:
                fd = folder.create(tmp)
                with open(fd, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                folder.rename(tmp, name)
                tmp = None
                folder.sync()
            finally:
                if tmp is not None:
                    folder.remove(tmp)
    except OSError as err:
        raise CheckpointError(f"cannot write {output}: {err.strerror or err}") from None
