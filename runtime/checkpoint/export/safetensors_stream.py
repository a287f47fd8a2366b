"""A safetensors file written tensor by tensor: memory bounded by the largest tensor.

The format is an 8-byte little-endian header length, a JSON header giving every tensor's
dtype, shape and byte range, then the bytes. The header only needs shapes and dtypes, which a
checkpoint reader knows before reading any data, so the file is written in one pass: header
first, then each tensor as it is read. Written to a temporary name and renamed at the end.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Sequence

import torch

from ..errors import CheckpointError

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
    """``with SafetensorsStream(path, plan, metadata) as f: f.write(name, tensor)`` for every
    ``(name, shape, dtype)`` of ``plan``, in its order."""

    def __init__(
        self,
        path: str,
        plan: Sequence[tuple[str, tuple[int, ...], torch.dtype]],
        metadata: dict[str, str],
    ):
        self.path = os.path.abspath(path)
        self.plan = list(plan)
        self._next = 0
        header: dict = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
        at = 0
        for name, shape, dtype in self.plan:
            if dtype not in ST_DTYPES:
                raise CheckpointError(f"cannot store {name}: dtype {dtype} is not supported")
            size = tensor_bytes(shape, dtype)
            header[name] = {
                "dtype": ST_DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [at, at + size],
            }
            at += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self._header = struct.pack("<Q", len(raw)) + raw
        self.data_bytes = at
        self._tmp = f"{self.path}.tmp-{os.getpid()}"
        self._file = None

    def __enter__(self) -> SafetensorsStream:
        try:
            self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed in __exit__
            self._file.write(self._header)
        except OSError as err:
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
            self._file.close()
            if exc_type is None:
                if self._next != len(self.plan):
                    raise CheckpointError(
                        f"{self.path}: {len(self.plan) - self._next} tensors were not written"
                    )
                os.replace(self._tmp, self.path)
        except OSError as err:
            raise CheckpointError(f"cannot write {self.path}: {err.strerror or err}") from None
        finally:
            if os.path.exists(self._tmp):
                os.remove(self._tmp)
