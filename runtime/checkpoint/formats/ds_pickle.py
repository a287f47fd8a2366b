"""Reading DeepSpeed's pickled ``.pt`` files without running their pickles.

Every file goes through ``torch.load(weights_only=True)``, which builds only tensors, plain
containers and the globals on an allow-list. DeepSpeed's files hold four more types; each is
allowed under its DeepSpeed name but built as a small stand-in here, so nothing of DeepSpeed
is imported or run (DeepSpeed need not even be installed):

* ``LossScaler`` / ``DynamicLossScaler`` (the fp16 loss scaler, its attributes as a dict),
* ``ZeroStageEnum`` (an int),
* ``fragment_address`` (``numel``, ``start``: where a parameter sits in a flat partition).

Anything else is refused with a `CheckpointError` that names the type and the file.

A crafted file costs bounded time and memory before it is refused (`check_archive`,
`check_object_graph`): the zip must be a regular file whose entries are what ``torch.save``
writes (tensor data stored uncompressed, so memory-mapped bytes are the tensor's own; any
other entry inflated to at most `MAX_INFLATED_BYTES`), and the unpickled object must be a
tree, give or take shared references, no deeper than `MAX_DEPTH`: a pickle memo that
references one container from many places is a few bytes that any walk over the content
(a copy, a JSON encoding, a comparison) expands exponentially.
"""

from __future__ import annotations

import os
import pickle
import re
import stat
import zipfile
import zlib
from typing import Any

import torch

from ..errors import CheckpointError

__all__ = [
    "DSObject",
    "ZeroStage",
    "load_ds_file",
    "check_archive",
    "check_object_graph",
    "ALLOWED_TYPES",
    "MAX_INFLATED_BYTES",
    "MAX_DEPTH",
]

# torch.save stores every entry uncompressed; a compressed entry other than tensor data is
# inflated to at most this many bytes (declared and actual), far above any DeepSpeed pickle.
MAX_INFLATED_BYTES = 64 << 20
# DeepSpeed's files nest a handful of levels (client state may add some).
MAX_DEPTH = 100
# Visits of a walk over the content as a tree, beyond one per stored reference: sharing that
# DeepSpeed's files have (a tensor or a string referenced twice) costs nothing here, since
# leaves are counted once per reference already; only a shared container multiplies.
_EXPANSION_SLACK = 100_000


class DSObject:
    """An allowed DeepSpeed object: its pickled attributes, nothing else."""

    ds_type = "object"

    def __init__(self, *args: Any) -> None:
        self.args = args
        self.attrs: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        # A dataclass or plain object pickles its __dict__; a slotted one a (None, slots) pair.
        if isinstance(state, tuple) and len(state) == 2:
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise CheckpointError(f"a pickled {self.ds_type} holds {type(state).__name__}")
        self.attrs = dict(state)

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def __repr__(self) -> str:
        return f"{self.ds_type}({self.attrs})"


class _LossScaler(DSObject):
    ds_type = "LossScaler"


class _DynamicLossScaler(DSObject):
    ds_type = "DynamicLossScaler"


class _FragmentAddress(DSObject):
    ds_type = "fragment_address"


class ZeroStage(int):
    """DeepSpeed's ``ZeroStageEnum`` member, as its stage number."""


ALLOWED_TYPES: dict[str, type] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": _LossScaler,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": _DynamicLossScaler,
    "deepspeed.runtime.zero.config.ZeroStageEnum": ZeroStage,
    "deepspeed.utils.tensor_fragment.fragment_address": _FragmentAddress,
}

_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def load_ds_file(path: str) -> Any:
    """The content of one DeepSpeed ``.pt`` file, memory-mapped (tensors are paged in when
    read), or a CheckpointError naming the file and, for a refused type, the type."""
    allowed = [(cls, name) for name, cls in ALLOWED_TYPES.items()]
    try:
        check_archive(path)
        with torch.serialization.safe_globals(allowed):
            content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        check_object_graph(content, path)
        return content
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing; the DeepSpeed checkpoint is incomplete"
        ) from None
    except pickle.UnpicklingError as err:
        found = _UNSUPPORTED_GLOBAL.search(str(err))
        if found:
            raise CheckpointError(
                f"{path} holds a pickled {found.group(1)}, which is not one of the types a "
                f"DeepSpeed checkpoint stores ({', '.join(sorted(ALLOWED_TYPES))}, tensors and "
                "plain containers); it is not loaded, since loading it would run its code"
            ) from None
        raise CheckpointError(f"{path} cannot be read ({err}); the file is corrupt") from None
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - a corrupt zip or pickle: name the file
        raise CheckpointError(
            f"{path} is not a readable torch file ({type(err).__name__}: {err}); the file is "
            "corrupt or not part of a DeepSpeed checkpoint"
        ) from None


def check_archive(path: str) -> None:
    """Refuse, before torch reads it, a file that is not a regular file (a FIFO would block
    the read, a device never end) or a zip whose entries would cost more than it declares."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(
            f"{path} is not a regular file; a DeepSpeed checkpoint file is one written by "
            "torch.save: replace it with the file that save wrote"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            inflated = 0
            for entry in entries:
                if entry.compress_type == zipfile.ZIP_STORED:
                    if (
                        entry.compress_size != entry.file_size
                        or entry.header_offset + entry.compress_size > info.st_size
                    ):
                        raise CheckpointError(
                            f"{path}: zip entry {entry.filename} declares {entry.file_size} "
                            f"bytes stored in {entry.compress_size}, beyond the file's "
                            f"{info.st_size}; the file is corrupt"
                        )
                    continue
                if "/data/" in entry.filename:
                    raise CheckpointError(
                        f"{path}: tensor data {entry.filename} is stored compressed; torch.save "
                        "stores tensor data uncompressed (it is memory-mapped as it lies in "
                        "the file), so this file was not written by torch.save"
                    )
                inflated += entry.file_size
                if inflated > MAX_INFLATED_BYTES:
                    raise CheckpointError(
                        f"{path}: zip entry {entry.filename} declares {entry.file_size} bytes "
                        f"compressed into {entry.compress_size}; more than "
                        f"{MAX_INFLATED_BYTES >> 20} MiB of compressed entries is refused "
                        "(torch.save writes no compressed entries)"
                    )
                _inflate_within(archive, entry, path)
    except zipfile.BadZipFile as err:
        raise CheckpointError(
            f"{path} is not a zip archive as torch.save writes ({err}); the file is corrupt or "
            "was saved by a torch older than 1.6 (load and save it again with a newer torch)"
        ) from None


def _inflate_within(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, path: str) -> None:
    """Inflate ``entry`` in pieces: zipfile stops at its declared size and checks its CRC, so
    an entry that inflates to more (or other bytes) than it declares is refused unread."""
    try:
        with archive.open(entry) as stream:
            while stream.read(1 << 20):
                pass
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise CheckpointError(
            f"{path}: zip entry {entry.filename} does not inflate to the {entry.file_size} "
            f"bytes it declares ({err}); the file is corrupt or crafted"
        ) from None


def _children(obj: Any) -> list | None:
    """The references a container holds (None for a leaf)."""
    if isinstance(obj, dict):
        return [*obj.keys(), *obj.values()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, DSObject):
        # Unpickled through __new__, an object may lack either (then it holds nothing).
        return [*getattr(obj, "args", ()), *getattr(obj, "attrs", {}).values()]
    return None


def check_object_graph(content: Any, path: str) -> None:
    """Refuse an unpickled object that a walk as a tree would expand far beyond what the file
    stores (containers shared through the pickle memo), that contains itself, or that nests
    deeper than `MAX_DEPTH`. Linear in the distinct objects: each container's tree size is
    computed once, from its children's."""
    sizes: dict[int, int] = {}  # id -> nodes of its subtree walked as a tree
    keep: list[Any] = []  # holds every visited container, so no id is reused meanwhile
    references = 0
    open_ids: set[int] = set()
    stack: list[tuple[Any, list | None]] = [(content, _children(content))]
    if stack[0][1] is None:
        return
    open_ids.add(id(content))
    while stack:
        obj, children = stack[-1]
        if children:
            child = children.pop()
            references += 1
            grand = _children(child)
            if grand is None or id(child) in sizes:
                continue
            if id(child) in open_ids:
                raise CheckpointError(
                    f"{path} holds a {type(child).__name__} that contains itself; DeepSpeed "
                    "writes no such object, and walking it would never end"
                )
            if len(stack) >= MAX_DEPTH:
                raise CheckpointError(
                    f"{path} nests containers more than {MAX_DEPTH} levels deep; DeepSpeed's "
                    "files nest a few levels, so the file is crafted or corrupt"
                )
            keep.append(child)
            open_ids.add(id(child))
            stack.append((child, grand))
            continue
        stack.pop()
        open_ids.discard(id(obj))
        sizes[id(obj)] = 1 + sum(sizes.get(id(c), 1) for c in _children(obj))
    walked = sizes[id(content)]
    if walked > 2 * references + _EXPANSION_SLACK:
        raise CheckpointError(
            f"{path} stores {references} references that, walked as a tree, reach {walked} "
            "objects: containers shared through the pickle memo would make every copy or "
            "comparison of it exponential; DeepSpeed writes no such file, so it is refused"
        )
