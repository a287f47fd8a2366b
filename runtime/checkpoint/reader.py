"""Reading a checkpoint: validate the manifest and files, then read exactly the ranges asked.

`CheckpointReader(path)` checks everything it can without reading tensor data: the manifest's
structure, that every parameter's pieces tile it exactly once per kind, that every shard
exists with the size the manifest records (a file cut by one byte is caught here). Range reads
open only the shards that overlap and read only the overlapping bytes (``get_slice``); every
failure becomes a `CheckpointError` naming the file.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import zlib
from collections.abc import Mapping
from typing import Any

import torch

from . import jsonable
from .errors import CheckpointError
from .storage import _EXTRA_PREFIX, FORMAT, MANIFEST, VERSION, Piece

__all__ = ["CheckpointReader"]


def _numel(shape) -> int:
    return math.prod(shape)


class CheckpointReader:
    """One checkpoint directory, validated; use as a context manager to close the shards."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.manifest_path = os.path.join(self.path, MANIFEST)
        self.manifest = self._read_manifest()
        self._handles: dict[str, Any] = {}
        self._validate()

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
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise self._bad(f"parameter {name}: shape must be a list of sizes, got {shape!r}")
            self.shapes[name] = tuple(shape)
        self.kinds: dict[str, str] = dict(m.get("kinds") or {})
        # name -> sorted list of (offset, end, shard index); one tiling per parameter.
        self._index: dict[str, list[tuple[int, int, int]]] = {n: [] for n in self.shapes}
        self.extra: dict[str, tuple[int, dict]] = {}
        for i, shard in enumerate(shards):
            if not isinstance(shard, dict) or shard.get("rank") != i:
                raise self._bad(f"shard record {i} is malformed")
            file = os.path.join(self.path, str(shard.get("file")))
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
                if name not in self._index:
                    raise self._bad(f"shard {i} holds {name}, which 'params' does not list")
                self._index[name].append((offset, offset + numel, i))
            for name, info in (shard.get("extra") or {}).items():
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

    # ------------------------------------------------------------------ queries
    @property
    def world_size(self) -> int:
        return self.manifest["world_size"]

    def state(self, key: str, default: Any = None) -> Any:
        """A JSON field of the manifest, decoded (tuples, tensors restored)."""
        return jsonable.decode(self.manifest.get(key, default))

    def rank_state(self, rank: int) -> Any:
        return jsonable.decode(self.manifest["rank_state"][rank])

    def shard_file(self, index: int) -> str:
        return os.path.join(self.path, self.manifest["shards"][index]["file"])

    # ------------------------------------------------------------------ reads
    def _handle(self, file: str):
        handle = self._handles.get(file)
        if handle is None:
            from safetensors import safe_open

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
        out = torch.empty(hi - lo, dtype=getattr(torch, self.kinds[kind]))
        ranges = self._index[name]
        i = max(0, bisect.bisect_right(self._starts[name], lo) - 1)
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
        for i, shard in enumerate(self.manifest["shards"]):
            file = self.shard_file(i)
            crc = 0
            with open(file, "rb") as f:
                while chunk := f.read(1 << 24):
                    crc = zlib.crc32(chunk, crc)
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
