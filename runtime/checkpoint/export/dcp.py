"""A checkpoint as torch distributed checkpoint (DCP) files, without a process group.

``torch.distributed.checkpoint.load`` (and ``format_utils.dcp_to_torch_save``) read the
folder: one state dict whose keys are the model's names (tied names as their own copy, as
``model.state_dict()`` has them). DCP plans a save from the state dict's shapes and dtypes,
then asks its planner for each tensor's data as it writes: the plan is made from meta tensors
and the planner reads each tensor from the checkpoint only when DCP writes it (one thread),
so memory holds one tensor at a time. DCP writes by path: it is given the path of a private
folder's descriptor (``/proc/self/fd/N``), and the folder is switched in whole when complete
(`target.folder_output`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ..errors import CheckpointError
from ..held_dir import PRIVATE_FILE, HeldDir
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


def _writer(folder: HeldDir, output: str):
    """DCP's file writer, writing into ``folder`` by its descriptor's path (a swap of the
    folder's name cannot move the writes) and recording ``output`` as the checkpoint's id."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.metadata import StorageMeta

    class IntoHeldFolder(FileSystemWriter):
        def storage_meta(self):
            return StorageMeta(checkpoint_id=output, save_id=self.save_id)

    return IntoHeldFolder(folder.os_path, thread_count=1)


def write_dcp(
    reader,
    folder: HeldDir,
    output: str,
    dtype: torch.dtype,
    progress: Callable[[int], None] = lambda n: None,
) -> list[str]:
    """Write the checkpoint into ``folder`` (the private folder `target.folder_output`
    switches in as ``output``); returns the files written."""
    import torch.distributed.checkpoint as dcp

    plan = export_plan(reader, dtype, with_aliases=True)
    entries = {e.name: e for e in plan}
    state = {e.name: torch.empty(e.shape, dtype=e.dtype, device="meta") for e in plan}
    try:
        with warnings.catch_warnings():  # "no process group: one process" is the point here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(
                state,
                storage_writer=_writer(folder, output),
                planner=_planner(reader, entries, progress),
                no_dist=True,
            )
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - DCP wraps file errors in its own types
        raise CheckpointError(f"cannot write the DCP checkpoint {output}: {err}") from None
    names = sorted(folder.names())
    for name in names:  # DCP creates its files 0666 & ~umask; an export is as private as a save
        folder.chmod(name, PRIVATE_FILE)
    return names
