"""Reading a checkpoint: validate the manifest and files, then read exactly the ranges asked.

`CheckpointReader(path)` checks everything it can without reading tensor data: the manifest's
structure, that every parameter's pieces tile it exactly once per kind, that every shard is a
plain file inside the checkpoint folder with the size the manifest records (a file cut by one
byte is caught here), and that each shard's safetensors header holds every piece the manifest
gives it, with that shape and dtype, inside the file: so no size the manifest claims is ever
allocated before the files back it. Range reads open only the shards that overlap and read
only the overlapping bytes (``get_slice``); a shard's crc32 is checked the first time it is
opened (``verify=False`` skips that). Every failure, whatever the manifest holds, becomes a
`CheckpointError` naming the file.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import torch

from . import jsonable
from .errors import CheckpointError
from .storage import _EXTRA_PREFIX, FORMAT, MANIFEST, VERSION, Piece

__all__ = ["CheckpointReader"]

# safetensors dtype names -> the torch names the manifest uses.
_HEADER_DTYPES = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8}
_ITEM_BYTES.update({"int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1})
# A header larger than this is not one this runtime wrote (safetensors caps it at 100 MB too).
MAX_HEADER_BYTES = 100 * 1024 * 1024
_SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _numel(shape) -> int:
    return math.prod(shape)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class CheckpointReader:
    """One checkpoint directory, validated; use as a context manager to close the shards."""

    def __init__(self, path: str, *, verify: bool = True):
        self.path = os.path.abspath(path)
        self.manifest_path = os.path.join(self.path, MANIFEST)
        self.verify = verify
        self._handles: dict[str, Any] = {}
        self._checked: set[int] = set()  # shards whose header matched the manifest
        try:
            self.manifest = self._read_manifest()
            self._validate()
        except CheckpointError:
            raise
        except (Exception, RecursionError) as err:  # a crafted manifest: only our error escapes
            raise self._bad(f"malformed ({type(err).__name__}: {err})") from None

    # ------------------------------------------------------------------ manifest
    def _bad(self, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.manifest_path}: {problem}")

    def _read_manifest(self) -> dict:
        try:
            with open(self.manifest_path, encoding="utf-8") as f:
                manifest = json.load(f)
        except FileNotFoundError:
            raise CheckpointError(
                f"{self.manifest_path} not found: {self.path} is not a complete checkpoint"
            ) from None
        except (OSError, UnicodeDecodeError) as err:
            raise CheckpointError(f"cannot read {self.manifest_path}: {err}") from None
        except json.JSONDecodeError as err:
            raise CheckpointError(
                f"{self.manifest_path} is not valid JSON (line {err.lineno}: {err.msg}); the "
                "file is corrupt"
            ) from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CheckpointError(f"{self.manifest_path} is not a {FORMAT} manifest")
        if manifest.get("version") != VERSION:
            raise CheckpointError(
                f"{self.manifest_path}: format version {manifest.get('version')!r}, this "
                f"runtime reads version {VERSION}"
            )
        return manifest

    def _validate(self) -> None:
        m = self.manifest
        world = m.get("world_size")
        shards = m.get("shards")
        if not isinstance(world, int) or world < 1:
            raise self._bad(f"world_size must be a positive integer, got {world!r}")
        if not isinstance(shards, list) or len(shards) != world:
            raise self._bad(f"expected {world} shard records, found {len(shards or [])}")
        params = m.get("params")
        if not isinstance(params, dict):
            raise self._bad("'params' must map parameter names to their shapes")
        self.shapes: dict[str, tuple[int, ...]] = {}
        for name, info in params.items():
            shape = info.get("shape") if isinstance(info, dict) else None
            if not isinstance(shape, list) or not all(_count(d) for d in shape):
                raise self._bad(f"parameter {name}: shape must be a list of sizes, got {shape!r}")
            self.shapes[name] = tuple(shape)
        self.kinds: dict[str, str] = dict(m.get("kinds") or {})
        for kind, dtype in self.kinds.items():
            if dtype not in _ITEM_BYTES:
                raise self._bad(f"kind {kind!r} has an unknown dtype {dtype!r}")
        # name -> sorted list of (offset, end, shard index); one tiling per parameter.
        self._index: dict[str, list[tuple[int, int, int]]] = {n: [] for n in self.shapes}
        self.extra: dict[str, tuple[int, dict]] = {}
        for i, shard in enumerate(shards):
            if not isinstance(shard, dict) or shard.get("rank") != i:
                raise self._bad(f"shard record {i} is malformed")
            file = self._confined(i, shard.get("file"))
            if not os.path.isfile(file):
                raise CheckpointError(
                    f"{file} is missing (listed in {self.manifest_path}); the checkpoint is "
                    "incomplete"
                )
            size = os.path.getsize(file)
            if size != shard.get("bytes"):
                raise CheckpointError(
                    f"{file} has {size} bytes but {MANIFEST} records {shard.get('bytes')}: the "
                    "shard is truncated or was modified; use another checkpoint"
                )
            if shard.get("pieces") and set(shard.get("kinds", {})) != set(self.kinds):
                raise self._bad(f"shard {i} holds kinds {sorted(shard['kinds'])}")
            for rec in shard.get("pieces", []):
                try:
                    name, offset, numel = rec
                except (TypeError, ValueError):
                    raise self._bad(f"shard {i}: bad piece {rec!r}") from None
                if not (_count(offset) and _count(numel)):
                    raise self._bad(f"shard {i}: piece {rec!r} needs element counts >= 0")
                if name not in self._index:
                    raise self._bad(f"shard {i} holds {name}, which 'params' does not list")
                self._index[name].append((offset, offset + numel, i))
            for name, info in (shard.get("extra") or {}).items():
                if not isinstance(info, dict):
                    raise self._bad(f"shard {i}: extra tensor {name!r} is malformed")
                self.extra[name] = (i, info)
        for name, ranges in self._index.items():
            ranges.sort()
            expect = 0
            for lo, hi, i in ranges:
                if lo != expect or hi <= lo:
                    raise self._bad(
                        f"parameter {name}: the piece [{lo}, {hi}) in shard {i} does not "
                        f"continue at element {expect} (pieces overlap or leave a gap)"
                    )
                expect = hi
            if expect != _numel(self.shapes[name]):
                raise self._bad(
                    f"parameter {name} has shape {list(self.shapes[name])} "
                    f"({_numel(self.shapes[name])} elements) but its pieces hold {expect}; the "
                    "manifest does not match the shards"
                )
        self._starts = {n: [lo for lo, _, _ in r] for n, r in self._index.items()}

    def _confined(self, index: int, name: Any) -> str:
        """The shard's path: a plain file name, inside this folder (no '/', '..', links out)."""
        if not isinstance(name, str) or not _SHARD_NAME.fullmatch(name):
            raise self._bad(
                f"shard {index}: file name {name!r} is not a plain file name in {self.path}"
            )
        file = os.path.join(self.path, name)
        if os.path.dirname(os.path.realpath(file)) != os.path.realpath(self.path):
            raise self._bad(f"shard {index}: {file} leads outside {self.path}")
        return file

    def _check_header(self, index: int) -> None:
        """Every piece and extra tensor the manifest gives this shard is in its header, with
        the recorded shape and dtype and its bytes inside the file. Done before any read sizes
        a tensor from the manifest; once per shard."""
        if index in self._checked:
            return
        try:
            self._compare_header(index)
        except CheckpointError:
            raise
        except (Exception, RecursionError) as err:
            raise self._bad(f"shard {index} is malformed ({type(err).__name__}: {err})") from None
        self._checked.add(index)

    def _compare_header(self, index: int) -> None:
        shard = self.manifest["shards"][index]
        file = self.shard_file(index)
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
                f"{file}: unreadable safetensors header ({type(err).__name__}); the shard is "
                "corrupt"
            ) from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{file}: the safetensors header is not an object")
        data_bytes = size - 8 - length
        wanted: dict[str, tuple[list[int], str]] = {}
        kinds = shard.get("kinds") or {}
        for name, _offset, numel in (tuple(r) for r in shard.get("pieces", [])):
            for kind, dtype in kinds.items():
                wanted[f"{name}/{kind}"] = ([numel], dtype)
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
                ok = 0 <= lo <= hi <= data_bytes and hi - lo == _numel(shape) * _ITEM_BYTES[dtype]
            if not ok:
                raise CheckpointError(
                    f"{file}: tensor {key} is missing or differs from {MANIFEST} (shape "
                    f"{shape}, {dtype}); the manifest does not match the shard"
                )

    # ------------------------------------------------------------------ queries
    @property
    def world_size(self) -> int:
        return self.manifest["world_size"]

    def state(self, key: str, default: Any = None) -> Any:
        """A JSON field of the manifest, decoded (tuples, tensors restored)."""
        return self._decode(key, lambda: self.manifest.get(key, default))

    def rank_state(self, rank: int) -> Any:
        return self._decode(f"rank_state[{rank}]", lambda: self.manifest["rank_state"][rank])

    def _decode(self, what: str, get) -> Any:
        try:
            return jsonable.decode(get())
        except CheckpointError:
            raise
        except (Exception, RecursionError) as err:
            raise self._bad(f"{what} is malformed ({type(err).__name__}: {err})") from None

    def shard_file(self, index: int) -> str:
        return os.path.join(self.path, self.manifest["shards"][index]["file"])

    # ------------------------------------------------------------------ reads
    def _handle(self, file: str):
        handle = self._handles.get(file)
        if handle is None:
            from safetensors import safe_open

            if self.verify:
                self._verify(file)
            try:
                handle = safe_open(file, framework="pt")
            except Exception as err:  # safetensors raises its own error types
                raise CheckpointError(
                    f"{file} is not a readable safetensors file ({err}); the shard is corrupt"
                ) from None
            self._handles[file] = handle
        return handle

    def _slice(self, file: str, key: str, numel: int, lo: int, hi: int) -> torch.Tensor:
        handle = self._handle(file)
        try:
            part = handle.get_slice(key)
            shape = list(part.get_shape())
            if shape != [numel]:
                raise CheckpointError(
                    f"{file}: tensor {key} has shape {shape}, {MANIFEST} records [{numel}]; the "
                    "manifest does not match the shard"
                )
            return part[lo:hi]
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(
                f"{file}: cannot read {key} ({err}); the shard is corrupt"
            ) from None

    def read(self, name: str, kind: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Elements [lo, hi) of the flattened ``name`` of ``kind``, as a new 1-D tensor."""
        if name not in self._index:
            raise CheckpointError(f"{self.path} has no parameter {name}")
        if kind not in self.kinds:
            raise CheckpointError(
                f"{self.path} holds no {kind!r} state (it has {', '.join(sorted(self.kinds))})"
            )
        total = _numel(self.shapes[name])
        hi = total if hi is None else hi
        if not 0 <= lo <= hi <= total:
            raise CheckpointError(f"range [{lo}, {hi}) is outside {name} ({total} elements)")
        ranges = self._index[name]
        first = max(0, bisect.bisect_right(self._starts[name], lo) - 1)
        i = first
        while i < len(ranges) and ranges[i][0] < hi:
            self._check_header(ranges[i][2])  # the files back the size before it is allocated
            i += 1
        out = torch.empty(hi - lo, dtype=getattr(torch, self.kinds[kind]))
        i = first
        while i < len(ranges) and ranges[i][0] < hi:
            plo, phi, shard = ranges[i]
            a, b = max(lo, plo), min(hi, phi)
            if a < b:
                part = self._slice(
                    self.shard_file(shard), f"{name}/{kind}", phi - plo, a - plo, b - plo
                )
                if part.dtype != out.dtype or part.numel() != b - a:
                    raise CheckpointError(
                        f"{self.shard_file(shard)}: {name}/{kind} is {part.dtype} with "
                        f"{part.numel()} elements where {out.dtype} with {b - a} was expected"
                    )
                out[a - lo : b - lo] = part
            i += 1
        return out

    def read_pieces(self, wanted: list[tuple[Piece, str]]) -> list[torch.Tensor]:
        return [self.read(p.name, kind, p.offset, p.end) for p, kind in wanted]

    def read_full(self, name: str, kind: str = "param") -> torch.Tensor:
        return self.read(name, kind).view(self.shapes[name])

    def read_extra(self, name: str) -> torch.Tensor:
        index, info = self.extra[name]
        self._check_header(index)
        file = self.shard_file(index)
        handle = self._handle(file)
        try:
            t = handle.get_tensor(_EXTRA_PREFIX + name)
        except Exception as err:
            raise CheckpointError(
                f"{file}: cannot read {name} ({err}); the shard is corrupt"
            ) from None
        if list(t.shape) != list(info.get("shape", [])):
            raise CheckpointError(
                f"{file}: {name} has shape {list(t.shape)}, {MANIFEST} records {info.get('shape')}"
            )
        return t

    def verify_checksums(self) -> None:
        """Read every shard whole and compare its crc32 with the manifest's."""
        for i in range(len(self.manifest["shards"])):
            self._verify(self.shard_file(i))

    def _verify(self, file: str) -> None:
        """The shard's crc32 against the manifest's: catches a flipped byte and a shard that
        another save wrote over (the bytes are right, the content is not this manifest's)."""
        shard = next(s for i, s in enumerate(self.manifest["shards"]) if self.shard_file(i) == file)
        crc = 0
        try:
            with open(file, "rb") as f:
                while chunk := f.read(1 << 24):
                    crc = zlib.crc32(chunk, crc)
        except OSError as err:
            raise CheckpointError(f"cannot read {file}: {err.strerror or err}") from None
        if crc != shard.get("crc32"):
            raise CheckpointError(
                f"{file}: checksum {crc:#010x} differs from {shard.get('crc32')!r} recorded "
                f"in {MANIFEST}; the shard is corrupt"
            )

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> Mapping[str, Any]:
        return {
            "path": self.path,
            "world_size": self.world_size,
            "params": len(self.shapes),
            "kinds": sorted(self.kinds),
        }
