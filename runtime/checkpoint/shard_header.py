"""A shard's safetensors header against the manifest: every tensor the manifest gives the
shard is in the header, with the recorded shape and dtype, and its bytes lie inside the file.
Checked before any read sizes a tensor from the manifest, so no size a crafted manifest claims
is allocated before the file backs it.
"""

from __future__ import annotations

import json
import os
import struct

from .errors import CheckpointError
from .manifest import ITEM_BYTES, numel
from .storage import _EXTRA_PREFIX, MANIFEST

__all__ = ["MAX_HEADER_BYTES", "check_shard_header"]

# safetensors dtype names -> the torch names the manifest uses.
_HEADER_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
_HEADER_DTYPES.update({"I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8"})
_HEADER_DTYPES.update({"U8": "uint8", "BOOL": "bool"})
# A header larger than this is not one this runtime wrote (safetensors caps it at 100 MB too).
MAX_HEADER_BYTES = 100 * 1024 * 1024


def _read_header(file: str) -> tuple[dict, int]:
    """The header of ``file`` and the number of data bytes after it."""
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as f:
            head = f.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
            if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"{file}: no safetensors header; the shard is corrupt")
            header = json.loads(f.read(length))
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(
            f"{file}: unreadable safetensors header ({type(err).__name__}); the shard is corrupt"
        ) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: the safetensors header is not an object")
    return header, size - 8 - length


def check_shard_header(file: str, shard: dict) -> None:
    """Raise `CheckpointError` unless ``file``'s header holds the shard record's tensors."""
    header, data_bytes = _read_header(file)
    wanted: dict[str, tuple[list[int], str]] = {}
    kinds = shard.get("kinds") or {}
    for name, _offset, count in (tuple(r) for r in shard.get("pieces", [])):
        for kind, dtype in kinds.items():
            wanted[f"{name}/{kind}"] = ([count], dtype)
    for name, info in (shard.get("extra") or {}).items():
        wanted[_EXTRA_PREFIX + name] = (info.get("shape"), info.get("dtype"))
    for key, (shape, dtype) in wanted.items():
        entry = header.get(key)
        ok = (
            isinstance(entry, dict)
            and entry.get("shape") == shape
            and _HEADER_DTYPES.get(entry.get("dtype")) == dtype
            and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2
            and all(isinstance(v, int) for v in entry["data_offsets"])
        )
        if ok:
            lo, hi = entry["data_offsets"]
            ok = 0 <= lo <= hi <= data_bytes and hi - lo == numel(shape) * ITEM_BYTES[dtype]
        if not ok:
            raise CheckpointError(
                f"{file}: tensor {key} is missing or differs from {MANIFEST} (shape "
                f"{shape}, {dtype}); the manifest does not match the shard"
            )
