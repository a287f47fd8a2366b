"""A checkpoint's manifest, validated, and the index of which shard holds which range.

Checked without reading tensor data: the structure, that every parameter's pieces tile it
exactly once, that a shard lists each parameter at most once (it stores one tensor per piece
and kind: two pieces would read one stored tensor twice), that every shard is a plain file
inside the checkpoint folder with the size the manifest records (a file cut by one byte is
caught here), a different file from every other shard's, and large enough for the tensors
listed in it, so nothing a read allocates exceeds what is stored. Every failure, whatever the
manifest holds, is a `CheckpointError` naming the file and the field.
"""

from __future__ import annotations

import bisect
import collections
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

from .errors import CheckpointError
from .storage import _EXTRA_PREFIX, FORMAT, MANIFEST, VERSION

__all__ = ["Manifest", "ITEM_BYTES", "numel"]

ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8}
ITEM_BYTES.update({"int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1})
_SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# A manifest lists names, shapes and ranges; a million parameters stay far below this.
MAX_MANIFEST_BYTES = 1 << 30


def numel(shape) -> int:
    return math.prod(shape)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Manifest:
    """The validated ``manifest.json`` of the checkpoint in ``path``."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.manifest_path = os.path.join(self.path, MANIFEST)
        try:
            self.data = self._read()
            self._validate()
        except CheckpointError:
            raise
        except (Exception, RecursionError) as err:  # a crafted manifest: only our error escapes
            raise self.bad(f"malformed ({type(err).__name__}: {err})") from None

    def bad(self, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.manifest_path}: {problem}")

    def _read(self) -> dict:
        try:
            # Non-blocking: a FIFO in the manifest's place must not hang the reader.
            fd = os.open(self.manifest_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with open(fd, encoding="utf-8") as f:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise CheckpointError(f"{self.manifest_path} is not a regular file")
                if info.st_size > MAX_MANIFEST_BYTES:
                    raise CheckpointError(
                        f"{self.manifest_path} is {info.st_size} bytes, more than a manifest "
                        f"holds ({MAX_MANIFEST_BYTES}); the file is not this runtime's"
                    )
                manifest = json.loads(f.read(info.st_size + 1))  # sized: read(n) allocates n
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

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        m = self.data
        world = m.get("world_size")
        shards = m.get("shards")
        if not isinstance(world, int) or world < 1:
            raise self.bad(f"world_size must be a positive integer, got {world!r}")
        if not isinstance(shards, list) or len(shards) != world:
            raise self.bad(f"expected {world} shard records, found {len(shards or [])}")
        self.shapes = self._shapes(m.get("params"))
        self.kinds: dict[str, str] = dict(m.get("kinds") or {})
        for kind, dtype in self.kinds.items():
            if dtype not in ITEM_BYTES:
                raise self.bad(f"kind {kind!r} has an unknown dtype {dtype!r}")
            if "/" in kind or not kind:
                raise self.bad(f"kinds: {kind!r} is not a kind name (empty, or holds '/')")
        # Bytes one element of a piece takes in its shard, over every kind stored.
        self._element_bytes = sum(ITEM_BYTES[d] for d in self.kinds.values())
        self._inodes: dict[tuple[int, int], int] = {}
        # name -> sorted list of (offset, end, shard index); one tiling per parameter.
        self._index: dict[str, list[tuple[int, int, int]]] = {n: [] for n in self.shapes}
        self.extra: dict[str, tuple[int, dict]] = {}
        files = [shard.get("file") if isinstance(shard, dict) else None for shard in shards]
        counts = collections.Counter(f for f in files if isinstance(f, str))
        repeated = sorted(f for f, n in counts.items() if n > 1)
        if repeated:
            raise self.bad(f"shard file {repeated[0]!r} is listed by more than one shard record")
        for i, shard in enumerate(shards):
            self._index_shard(i, shard)
        for name, ranges in self._index.items():
            self._check_tiling(name, ranges)
        self._starts = {n: [lo for lo, _, _ in r] for n, r in self._index.items()}

    def _shapes(self, params: Any) -> dict[str, tuple[int, ...]]:
        if not isinstance(params, dict):
            raise self.bad("'params' must map parameter names to their shapes")
        shapes = {}
        for name, info in params.items():
            # Stored as "<name>/<kind>" beside "__full__/<extra>": a name must not blur that.
            if not name or "/" in name or name == _EXTRA_PREFIX.rstrip("/"):
                raise self.bad(f"params: {name!r} is not a parameter name (empty, or holds '/')")
            shape = info.get("shape") if isinstance(info, dict) else None
            if not isinstance(shape, list) or not all(_count(d) for d in shape):
                raise self.bad(f"parameter {name}: shape must be a list of sizes, got {shape!r}")
            shapes[name] = tuple(shape)
        return shapes

    def _index_shard(self, i: int, shard: Any) -> None:
        """Check shard record ``i`` and its file, and index its pieces and extra tensors.

        A shard stores each parameter's piece once, as one tensor per kind: a record listing
        a parameter twice would read one stored tensor into two places (and let a small file
        stand for a large parameter), so it is refused, as is a record whose pieces and extra
        tensors need more bytes than its file holds."""
        if not isinstance(shard, dict) or shard.get("rank") != i:
            raise self.bad(f"shard record {i} is malformed")
        file = self._confined(i, shard.get("file"))
        try:
            info = os.stat(file)
        except FileNotFoundError:
            info = None
        if info is None or not stat.S_ISREG(info.st_mode):
            raise CheckpointError(
                f"{file} is missing (listed in {self.manifest_path}); the checkpoint is incomplete"
            )
        if info.st_size != shard.get("bytes"):
            raise CheckpointError(
                f"{file} has {info.st_size} bytes but {MANIFEST} records {shard.get('bytes')}: "
                "the shard is truncated or was modified; use another checkpoint"
            )
        other = self._inodes.setdefault((info.st_dev, info.st_ino), i)
        if other != i:
            raise self.bad(f"shards {other} and {i} are one file (linked under two names)")
        pieces = shard.get("pieces", [])
        if not isinstance(pieces, list):
            raise self.bad(f"shards[{i}].pieces must be a list of [name, offset, count]")
        if pieces and set(shard.get("kinds", {})) != set(self.kinds):
            raise self.bad(f"shard {i} holds kinds {sorted(shard['kinds'])}")
        seen: dict[str, int] = {}
        needed = 0
        for j, rec in enumerate(pieces):
            try:
                name, offset, count = rec
            except (TypeError, ValueError):
                raise self.bad(f"shard {i}: bad piece {rec!r}") from None
            if not (_count(offset) and _count(count)):
                raise self.bad(f"shard {i}: piece {rec!r} needs element counts >= 0")
            if name not in self._index:
                raise self.bad(f"shard {i} holds {name}, which 'params' does not list")
            if name in seen:
                raise self.bad(
                    f"shards[{i}].pieces[{j}]: {name} is listed again (first at pieces"
                    f"[{seen[name]}]); a shard stores one piece of each parameter"
                )
            seen[name] = j
            self._index[name].append((offset, offset + count, i))
            needed += count * self._element_bytes
        extra = shard.get("extra") or {}
        if not isinstance(extra, dict):
            raise self.bad(f"shards[{i}].extra must map names to shapes and dtypes")
        for name, entry in extra.items():
            if not isinstance(entry, dict):
                raise self.bad(f"shard {i}: extra tensor {name!r} is malformed")
            if name in self.extra:
                first = self.extra[name][0]
                raise self.bad(f"extra tensor {name!r} is listed twice (shards {first} and {i})")
            needed += self._extra_bytes(i, name, entry)
            self.extra[name] = (i, entry)
        if needed > info.st_size:
            raise self.bad(
                f"shards[{i}] lists {needed} bytes of tensors, but {file} holds {info.st_size}: "
                "the manifest does not match the shard"
            )

    def _extra_bytes(self, i: int, name: str, entry: dict) -> int:
        shape, dtype = entry.get("shape"), entry.get("dtype", "float32")
        if not isinstance(shape, list) or not all(_count(d) for d in shape):
            raise self.bad(f"shards[{i}].extra[{name!r}].shape must be a list of sizes")
        if dtype not in ITEM_BYTES:
            raise self.bad(f"shards[{i}].extra[{name!r}].dtype {dtype!r} is unknown")
        return numel(shape) * ITEM_BYTES[dtype]

    def _check_tiling(self, name: str, ranges: list[tuple[int, int, int]]) -> None:
        ranges.sort()
        expect = 0
        for lo, hi, i in ranges:
            if lo != expect or hi <= lo:
                raise self.bad(
                    f"parameter {name}: the piece [{lo}, {hi}) in shard {i} does not "
                    f"continue at element {expect} (pieces overlap or leave a gap)"
                )
            expect = hi
        if expect != numel(self.shapes[name]):
            raise self.bad(
                f"parameter {name} has shape {list(self.shapes[name])} "
                f"({numel(self.shapes[name])} elements) but its pieces hold {expect}; the "
                "manifest does not match the shards"
            )

    def _confined(self, index: int, name: Any) -> str:
        """The shard's path: a plain file name, inside this folder (no '/', '..', links out)."""
        if not isinstance(name, str) or not _SHARD_NAME.fullmatch(name):
            raise self.bad(
                f"shard {index}: file name {name!r} is not a plain file name in {self.path}"
            )
        file = os.path.join(self.path, name)
        if os.path.dirname(os.path.realpath(file)) != os.path.realpath(self.path):
            raise self.bad(f"shard {index}: {file} leads outside {self.path}")
        return file

    # ------------------------------------------------------------------ queries
    @property
    def world_size(self) -> int:
        return self.data["world_size"]

    def shard(self, index: int) -> dict:
        return self.data["shards"][index]

    def shard_file(self, index: int) -> str:
        return os.path.join(self.path, self.shard(index)["file"])

    def overlapping(self, name: str, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """The pieces ``(offset, end, shard index)`` of ``name`` that overlap [lo, hi)."""
        ranges = self._index[name]
        i = max(0, bisect.bisect_right(self._starts[name], lo) - 1)
        while i < len(ranges) and ranges[i][0] < hi:
            yield ranges[i]
            i += 1
