"""A checkpoint as torch distributed checkpoint (DCP) files, without a process group.

``torch.distributed.checkpoint.load`` (and ``format_utils.dcp_to_torch_save``) read the
folder: one state dict whose keys are the model's names (tied names as their own copy, as
``model.state_dict()`` has them). DCP plans all tensors of a save at once, so this holds the
state dict in memory (a consolidated fp32 copy of the model).
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


def write_dcp(
    reader, dst: str, dtype: torch.dtype, progress: Callable[[int], None] = lambda n: None
) -> list[str]:
    import torch.distributed.checkpoint as dcp

    state = {}
    for e in export_plan(reader, dtype, with_aliases=True):
        state[e.name] = read_entry(reader, e)
        progress(tensor_bytes(e.shape, e.dtype))
    os.makedirs(dst, exist_ok=True)
    try:
        with (
            warnings.catch_warnings()
        ):  # "no process group: saving in a single process" is the point
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, storage_writer=dcp.FileSystemWriter(dst), no_dist=True)
    except Exception as err:  # noqa: BLE001 - DCP wraps file errors in its own types
        raise CheckpointError(f"cannot write the DCP checkpoint {dst}: {err}") from None
    return sorted(os.listdir(dst))
