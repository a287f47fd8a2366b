"""A checkpoint as torch distributed checkpoint (DCP) files, without a process group.

``torch.distributed.checkpoint.load`` (and ``format_utils.dcp_to_torch_save``) read the
folder: one state dict whose keys are the model's names (tied names as their own copy, as
``model.state_dict()`` has them). DCP plans a save from the state dict's shapes and dtypes,
then asks its planner for each tensor's data as it writes: the plan is made from meta tensors
and the planner reads each tensor from the checkpoint only when DCP writes it (one thread),
so memory holds one tensor at a time.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch

from ..errors import CheckpointError
from .plan import export_plan, read_entry
from .safetensors_stream import tensor_bytes

__all__ = ["write_dcp"]


def _planner(reader, entries: dict, progress: Callable[[int], None]):
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    class ReadOnWrite(DefaultSavePlanner):
        """The default plan; a tensor's data read from the checkpoint when it is written."""

        def lookup_object(self, index):
            entry = entries.get(index.fqn)
            if entry is None:
                return super().lookup_object(index)
            t = read_entry(reader, entry)
            progress(tensor_bytes(entry.shape, entry.dtype))
            return t

    return ReadOnWrite()


def write_dcp(
    reader, dst: str, dtype: torch.dtype, progress: Callable[[int], None] = lambda n: None
) -> list[str]:
    import torch.distributed.checkpoint as dcp

    plan = export_plan(reader, dtype, with_aliases=True)
    entries = {e.name: e for e in plan}
    state = {e.name: torch.empty(e.shape, dtype=e.dtype, device="meta") for e in plan}
    os.makedirs(dst, exist_ok=True)
    writer = dcp.FileSystemWriter(dst, thread_count=1)
    try:
        with warnings.catch_warnings():  # "no process group: one process" is the point here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(
                state,
                storage_writer=writer,
                planner=_planner(reader, entries, progress),
                no_dist=True,
            )
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - DCP wraps file errors in its own types
        raise CheckpointError(f"cannot write the DCP checkpoint {dst}: {err}") from None
    return sorted(os.listdir(dst))
