"""Reading a checkpoint: validate it, then read exactly the ranges asked.

`CheckpointReader(path)` validates the manifest (`manifest.Manifest`: structure, tiling,
shard files and sizes) without reading tensor data, and checks each shard's safetensors
header against it (`shard_header`) before the first read from that shard. Range reads open
only the shards that overlap and read only the overlapping bytes (``get_slice``); a shard's
crc32 is checked the first time it is opened (``verify=False`` skips that). Every failure,
whatever the manifest holds, becomes a `CheckpointError` naming the file.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import torch

from . import jsonable
from .errors import CheckpointError
from .manifest import Manifest, numel
from .shard_header import MAX_HEADER_BYTES, check_shard_header
from .storage import _EXTRA_PREFIX, MANIFEST, Piece

__all__ = ["CheckpointReader", "MAX_HEADER_BYTES"]


class CheckpointReader:
    """One checkpoint directory, validated; use as a context manager to close the shards."""

    def __init__(self, path: str, *, verify: bool = True):
        self._manifest = Manifest(path)
        self.path = self._manifest.path
        self.manifest_path = self._manifest.manifest_path
        self.manifest = self._manifest.data
        self.shapes: dict[str, tuple[int, ...]] = self._manifest.shapes
        self.kinds: dict[str, str] = self._manifest.kinds
        self.extra: dict[str, tuple[int, dict]] = self._manifest.extra
        self.verify = verify
        self._handles: dict[str, Any] = {}
        self._checked: set[int] = set()  # shards whose header matched the manifest

    def _bad(self, problem: str) -> CheckpointError:
        return self._manifest.bad(problem)

    def _check_header(self, index: int) -> None:
        """The shard's header holds what the manifest gives it (`shard_header`); once per
        shard, before any read sizes a tensor from the manifest."""
        if index in self._checked:
            return
        try:
            check_shard_header(self.shard_file(index), self._manifest.shard(index))
        except CheckpointError:
            raise
        except (Exception, RecursionError) as err:
            raise self._bad(f"shard {index} is malformed ({type(err).__name__}: {err})") from None
        self._checked.add(index)

    # ------------------------------------------------------------------ queries
    @property
    def world_size(self) -> int:
        return self._manifest.world_size

    def state(self, key: str, default: Any = None) -> Any:
        """A JSON field of the manifest, decoded (tuples, tensors restored)."""
        return self._decode(key, lambda: self.manifest.get(key, default))

    def rank_state(self, rank: int) -> Any:
        return self._decode(f"rank_state[{rank}]", lambda: self.manifest["rank_state"][rank])

    def _decode(self, what: str, get) -> Any:
        try:
            return jsonable.decode(get())
        except CheckpointError as err:  # the value's own fault (jsonable): name the file
            raise self._bad(f"{what}: {err}") from None
        except (Exception, RecursionError) as err:
            raise self._bad(f"{what} is malformed ({type(err).__name__}: {err})") from None

    def shard_file(self, index: int) -> str:
        return self._manifest.shard_file(index)

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

    def _slice(self, file: str, key: str, count: int, lo: int, hi: int) -> torch.Tensor:
        handle = self._handle(file)
        try:
            part = handle.get_slice(key)
            shape = list(part.get_shape())
            if shape != [count]:
                raise CheckpointError(
                    f"{file}: tensor {key} has shape {shape}, {MANIFEST} records [{count}]; the "
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
        if name not in self.shapes:
            raise CheckpointError(f"{self.path} has no parameter {name}")
        if kind not in self.kinds:
            raise CheckpointError(
                f"{self.path} holds no {kind!r} state (it has {', '.join(sorted(self.kinds))})"
            )
        total = numel(self.shapes[name])
        hi = total if hi is None else hi
        if not 0 <= lo <= hi <= total:
            raise CheckpointError(f"range [{lo}, {hi}) is outside {name} ({total} elements)")
        overlapping = list(self._manifest.overlapping(name, lo, hi))
        for _, _, shard in overlapping:
            self._check_header(shard)  # the files back the size before it is allocated
        out = torch.empty(hi - lo, dtype=getattr(torch, self.kinds[kind]))
        for plo, phi, shard in overlapping:
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
