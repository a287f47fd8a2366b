"""A safetensors file written tensor by tensor: memory bounded by the largest tensor.

The format is an 8-byte little-endian header length, a JSON header giving every tensor's
dtype, shape and byte range, then the bytes. The header only needs shapes and dtypes, which a
checkpoint reader knows before reading any data, so the file is written in one pass: header
first, then each tensor as it is read.

The file is created in a folder held by descriptor (`HeldDir`) under a random temporary name
(``O_EXCL|O_NOFOLLOW``: never through a link someone planted), locked while it is written (so
a later export tells a crashed one's leftover from a live one), fsync'd, and renamed to its
name only once complete: a reader never sees half a file. Files are 0600, as checkpoints are:
they hold the model.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import struct
from collections.abc import Sequence

import torch

from ..errors import CheckpointError
from ..held_dir import HeldDir, temp_name

__all__ = ["SafetensorsStream", "ST_DTYPES", "tensor_bytes"]

ST_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def tensor_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


class SafetensorsStream:
    """``with SafetensorsStream(folder, name, plan, metadata) as f: f.write(name, tensor)``
    for every ``(name, shape, dtype)`` of ``plan``, in its order."""

    def __init__(
        self,
        folder: HeldDir,
        name: str,
        plan: Sequence[tuple[str, tuple[int, ...], torch.dtype]],
        metadata: dict[str, str],
    ):
        self.folder = folder
        self.name = name
        self.path = os.path.join(folder.path, name)
        self.plan = list(plan)
        self._next = 0
        header: dict = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
        at = 0
        for key, shape, dtype in self.plan:
            if dtype not in ST_DTYPES:
                raise CheckpointError(f"cannot store {key}: dtype {dtype} is not supported")
            size = tensor_bytes(shape, dtype)
            header[key] = {
                "dtype": ST_DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [at, at + size],
            }
            at += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self._header = struct.pack("<Q", len(raw)) + raw
        self.data_bytes = at
        self._tmp = temp_name(name)
        self._file = None

    def __enter__(self) -> SafetensorsStream:
        try:
            fd = self.folder.create(self._tmp)
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until closed: this file is being written
            self._file = open(fd, "wb")  # noqa: SIM115 - closed in __exit__
            self._file.write(self._header)
        except OSError as err:
            self._discard()
            raise CheckpointError(f"cannot write {self.path}: {err.strerror or err}") from None
        return self

    def write(self, name: str, tensor: torch.Tensor) -> None:
        want_name, shape, dtype = self.plan[self._next]
        if name != want_name or tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise CheckpointError(
                f"{self.path}: expected {want_name} {list(shape)} {dtype}, got {name} "
                f"{list(tensor.shape)} {tensor.dtype}"
            )
        t = tensor.detach().to("cpu").contiguous()
        self._file.write(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        self._next += 1

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                if self._next != len(self.plan):
                    raise CheckpointError(
                        f"{self.path}: {len(self.plan) - self._next} tensors were not written"
                    )
                self._file.flush()
                os.fsync(self._file.fileno())
                self.folder.rename(self._tmp, self.name)
                self._tmp = None
        except OSError as err:
            raise CheckpointError(f"cannot write {self.path}: {err.strerror or err}") from None
        finally:
            self._file.close()
            self._discard()

    def _discard(self) -> None:
        """Remove the temporary file of a write that did not complete."""
        if self._tmp is not None:
            try:
                os.unlink(self._tmp, dir_fd=self.folder.fd)
            except OSError:
                pass
            self._tmp = None
