"""What a checkpoint exports as a state dict, known before any tensor is read.

Trained parameters come from the fp32 master weights (read whole, one at a time), buffers and
frozen parameters as stored. Tied names (``aliases``) are either written as their own copy (a
plain state dict that ``load_state_dict`` takes) or left out (Hugging Face's format: the model
ties them again when it loads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CheckpointError

__all__ = ["Entry", "export_plan", "read_entry"]


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    source: str
    """The name read: the parameter itself, or the parameter an alias ties it to."""
    extra: bool = False


def _out_dtype(stored: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and stored.is_floating_point else stored


def export_plan(reader, dtype: torch.dtype | None, *, with_aliases: bool) -> list[Entry]:
    plan = [
        Entry(n, tuple(s), _out_dtype(torch.float32, dtype), n) for n, s in reader.shapes.items()
    ]
    if with_aliases:
        for alias, name in (reader.state("aliases") or {}).items():
            if name not in reader.shapes:
                raise CheckpointError(f"{reader.manifest_path}: alias {alias} of unknown {name}")
            plan.append(Entry(alias, tuple(reader.shapes[name]), plan[0].dtype, name))
    for name, (_, info) in reader.extra.items():
        stored = getattr(torch, str(info.get("dtype", "float32")))
        plan.append(Entry(name, tuple(info["shape"]), _out_dtype(stored, dtype), name, True))
    return plan


def read_entry(reader, entry: Entry) -> torch.Tensor:
    t = reader.read_extra(entry.source) if entry.extra else reader.read_full(entry.source)
    return t.detach().to(entry.dtype).reshape(entry.shape)
