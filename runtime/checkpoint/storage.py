"""Checkpoint files: one safetensors shard per rank, a JSON manifest, an atomic ``latest``.

This layer knows nothing of engines or process groups. A rank hands it *pieces* — a
contiguous range ``[offset, offset + numel)`` of one flattened parameter — with one 1-D
tensor per *kind* (``param`` for the fp32 master weights, ``exp_avg``, ``exp_avg_sq``, ...).
It stores them in its shard under ``"<name>/<kind>"`` and records the ranges in the manifest,
so a reader at any world size finds, for any range of any parameter, the shards that hold it
and reads exactly those bytes (``safe_open`` + ``get_slice``).

Directory of one checkpoint::

    save_dir/
      latest                          the tag, written last and atomically
      <tag>/manifest.json             world size, parameters, pieces per rank, JSON state
      <tag>/shard-00000-of-00004.safetensors
      .<tag>.partial-<token>/         a save in progress; never read
      .zlaunch-save.lock              held by rank 0 of the save in progress

Commit protocol (every rank calls `write_checkpoint`; ``agree(ok)`` is an all-ranks AND that
doubles as a barrier, ``share(n)`` gives every rank rank 0's ``n``):

1. rank 0 takes the directory's lock (another save in progress there, from another job say,
   is refused: two saves would mix their shards), removes what crashed saves left, creates
   ``.<tag>.partial-<token>`` with a fresh token; agree; share the token.
2. every rank writes and fsyncs its shard and a small sidecar (bytes, crc32, pieces, RNG);
   agree — a rank that failed makes every rank raise, rank 0 removes the partial directory
   (a full disk stays no fuller than before), and nothing is committed.
3. rank 0 merges the sidecars into ``manifest.json`` (fsync), puts the directory in place as
   ``<tag>`` (fsync of the parent), then writes ``latest`` (temp, fsync, rename, fsync);
   agree, so no rank returns before the checkpoint is complete. An existing ``<tag>`` is
   swapped with the new one in one atomic exchange; where the file system cannot exchange,
   it is renamed to ``.<tag>.old`` first, and a crash between the two renames leaves
   ``.<tag>.old``, which `resolve_checkpoint` reads and the next save puts back.

A crash at any point leaves ``latest`` naming a complete checkpoint. Folders are 0700 and
files 0600: a checkpoint holds the whole model.

The save folder may be writable by others (a shared project folder): every write goes through
a `held_dir.HeldDir` of it, so no link planted under any name the save uses is ever followed.
The partial folder's token is random (62 bits: nobody can plant at its name beforehand), the
folder is checked to be ours alone before a rank writes into it, files are created
``O_EXCL|O_NOFOLLOW``, ``latest`` is written under a random temporary name and renamed over
whatever stood there, and what crashed saves left is removed only when it is a folder of ours
(never through a link).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import jsonable
from .errors import CheckpointError
from .held_dir import PRIVATE_FILE, HeldDir, owned_by_us

__all__ = [
    "Piece",
    "FORMAT",
    "MANIFEST",
    "LATEST",
    "SLOW_SAVE_ENV",
    "shard_file_name",
    "validate_tag",
    "write_checkpoint",
    "resolve_checkpoint",
    "read_latest",
    "atomic_write_text",
]

FORMAT = "zlaunch-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
SLOW_SAVE_ENV = "ZLAUNCH_TEST_SLOW_SAVE"
"""Test hook: ``SECONDS`` or ``SECONDS@TAG`` sleeps in the middle of writing each shard (of
that tag only), so that a test can kill a worker while a shard is half written."""

_EXTRA_PREFIX = "__full__/"
LOCK_FILE = ".zlaunch-save.lock"
MAX_LATEST_BYTES = 4096
"""``latest`` holds one tag; anything larger is not a ``latest`` file."""
MAX_SIDECAR_BYTES = 1 << 30


@dataclass(frozen=True, order=True)
class Piece:
    """Elements ``[offset, offset + numel)`` of the flattened parameter ``name``."""

    name: str
    offset: int
    numel: int

    @property
    def end(self) -> int:
        return self.offset + self.numel


def shard_file_name(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}.safetensors"


def _sidecar_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def validate_tag(tag: str) -> str:
    tag = str(tag)
    if not tag or tag.startswith(".") or "/" in tag or "\\" in tag or tag == LATEST:
        raise CheckpointError(
            f"bad checkpoint tag {tag!r}: a tag is one directory name, not empty, not "
            f"starting with '.', not {LATEST!r}"
        )
    return tag


# ---------------------------------------------------------------------------- file helpers
def atomic_write_text(path: str, text: str) -> None:
    """Write ``path`` so that readers see the old or the new content, never a mix; a link
    standing at ``path`` is replaced, never written through (see `HeldDir.replace`)."""
    with HeldDir.open(os.path.dirname(os.path.abspath(path))) as folder:
        folder.replace(os.path.basename(path), text.encode("utf-8"))


def _slow_save_seconds(tag: str) -> float:
    raw = os.environ.get(SLOW_SAVE_ENV, "").strip()
    if not raw:
        return 0.0
    seconds, _, only = raw.partition("@")
    if only and only != tag:
        return 0.0
    try:
        return max(0.0, float(seconds))
    except ValueError:
        raise CheckpointError(f"{SLOW_SAVE_ENV}={raw!r}: expected SECONDS or SECONDS@TAG") from None


_ST_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


# safetensors' dtype codes, as its header spells them.
_ST_CODES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
_WRITE_PIECE = 64 << 20  # bytes per write(): crc32 reads a piece while it is still in cache


def _shard_layout(tensors: Mapping[str, torch.Tensor], metadata: dict[str, str]):
    """The safetensors header of ``tensors`` (in their order, back to back) and the tensors as
    contiguous CPU tensors, so their memory can be written as it is."""
    keep, header, offset = [], {}, 0
    for key, t in tensors.items():
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype not in _ST_DTYPES:
            raise CheckpointError(f"cannot store {key}: dtype {t.dtype} is not supported")
        nbytes = t.numel() * t.element_size()
        header[key] = {
            "dtype": _ST_CODES[_ST_DTYPES[t.dtype]],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
        keep.append(t)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return len(text).to_bytes(8, "little") + text, keep


def _byte_views(tensors: list[torch.Tensor]):
    for t in tensors:
        if t.numel():
            data = memoryview(t.reshape(-1).view(torch.uint8).numpy())
            for start in range(0, len(data), _WRITE_PIECE):
                yield data[start : start + _WRITE_PIECE]


def _write_shard(
    folder: HeldDir, name: str, tensors: Mapping[str, torch.Tensor], metadata, slow_s: float
) -> tuple[int, int]:
    """Write ``tensors`` as a safetensors file straight from their memory (no serialised copy
    of the shard: that copy cost as long as the disk's write), crc32 computed on the way;
    one fsync. Returns the file's bytes and crc32."""
    prefix, keep = _shard_layout(tensors, metadata)
    total = len(prefix) + sum(t.numel() * t.element_size() for t in keep)
    fd = folder.create(name)
    try:
        crc = zlib.crc32(prefix)
        _write_all(fd, memoryview(prefix))
        written = len(prefix)
        slowed = slow_s <= 0
        for view in _byte_views(keep):
            crc = zlib.crc32(view, crc)
            _write_all(fd, view)
            written += len(view)
            if not slowed and written >= total // 2:
                os.fsync(fd)  # half the shard is on disk while the save is held up
                time.sleep(slow_s)
                slowed = True
        os.fsync(fd)
    finally:
        os.close(fd)
    return total, crc


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------------------- save
class _SaveLock:
    """Rank 0's hold on a checkpoint directory for one save (flock: freed if it dies)."""

    def __init__(self, root: HeldDir):
        self.path = os.path.join(root.path, LOCK_FILE)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(LOCK_FILE, flags, PRIVATE_FILE, dir_fd=root.fd)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                # A hard link to a file elsewhere, or a FIFO: not a lock any save made.
                raise CheckpointError(
                    f"{self.path} is not this runtime's lock file (a link to another file, or "
                    "not a regular file); remove it, and keep others from writing into "
                    f"{root.path}"
                )
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointError(
                f"another save into {root.path} is in progress ({self.path} is locked): two "
                "jobs saving into one directory would mix their shards; give each job its own "
                "save_dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def release(self) -> None:
        os.close(self.fd)  # closing drops the flock


def _remove_leftovers(root: HeldDir) -> None:
    """What crashed or failed saves left (rank 0, holding the lock: no save is running).

    Partial directories and ``latest``'s temporary files go. A ``.<tag>.old`` whose ``<tag>``
    is missing is the only copy of that tag (a crash between the two renames of a re-save):
    it is put back, not removed. Only real folders and files of this user are touched: a link
    or another user's entry under such a name was not left by a save.
    """
    for name in root.names():
        if not name.startswith("."):
            continue
        info = root.lstat(name)
        if info is None or not owned_by_us(info.st_uid):
            continue
        if stat.S_ISREG(info.st_mode) and name.startswith(f".{LATEST}.tmp-"):
            root.remove(name)
        elif not stat.S_ISDIR(info.st_mode):
            continue
        elif ".partial-" in name:
            root.remove(name)
        elif name.endswith(".old"):
            tag = name[1 : -len(".old")]
            if tag and root.lstat(tag) is None:
                root.rename_new(name, tag)
            else:
                root.remove(name)


def _as_error(err: BaseException, what: str) -> CheckpointError:
    """Any failure as the one error type, so that every rank reaches the agreement."""
    if isinstance(err, CheckpointError):
        return err
    return CheckpointError(f"{what}: {_reason(err)}")


def _reason(err: BaseException) -> str:
    """What went wrong, in words (an OSError with the file it concerns)."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    return str(err) or type(err).__name__


def write_checkpoint(
    save_dir: str,
    tag: str,
    *,
    rank: int,
    world_size: int,
    agree: Callable[[bool], bool],
    pieces: Sequence[tuple[Piece, Mapping[str, torch.Tensor]]],
    extra: Mapping[str, torch.Tensor] | None = None,
    rank_state: Any = None,
    manifest_fields: Callable[[], dict] | None = None,
    save_latest: bool = True,
    share: Callable[[int], int] | None = None,
) -> str:
    """Write this rank's part of checkpoint ``tag``; every rank must call it. Returns the path.

    ``pieces``: this rank's ranges with a 1-D tensor per kind (same kinds on every rank).
    ``extra``: whole tensors stored as they are (rank 0: buffers, frozen parameters).
    ``rank_state``: JSON-able per-rank state (RNG). ``manifest_fields``: called on rank 0 only,
    returns the JSON-able global state merged into the manifest (must hold ``params``).
    ``share``: a collective returning rank 0's argument on every rank; it gives every rank the
    partial folder's random name. It may be left out by a single rank only.
    """
    assert share is not None or world_size == 1, "ranks need share() to agree on a name"
    tag = validate_tag(tag)
    save_dir = os.path.abspath(save_dir)
    final = os.path.join(save_dir, tag)
    token = secrets.randbits(62) if rank == 0 else 0
    root = partial = lock = error = None
    if rank == 0:
        root, lock, partial, error = _start(save_dir, tag, token, final)
    try:
        if not agree(error is None):
            raise error or CheckpointError(f"rank 0 could not start saving {final}")
        if share is not None:
            token = share(token)
        try:
            if partial is None:  # another rank: hold the folder rank 0 made, checked ours
                root = HeldDir.open(save_dir)
                partial = root.subdir(_partial_name(tag, token), private=True)
            _write_rank(partial, tag, rank, world_size, pieces, extra or {}, rank_state)
        except Exception as err:  # noqa: BLE001 - every rank must reach agree()
            where = partial.path if partial else os.path.join(save_dir, _partial_name(tag, token))
            error = CheckpointError(
                f"rank {rank}: writing its shard in {where} failed: {_reason(err)}"
            )
        if not agree(error is None):
            if rank == 0:
                _discard(root, _partial_name(tag, token))
            raise error or CheckpointError(
                f"another rank failed to write its shard of {tag}; nothing was committed and "
                f"{os.path.join(save_dir, LATEST)} is unchanged"
            )
        if rank == 0:
            commit = (root, tag, partial, token, world_size, manifest_fields, save_latest)
            error = _try_commit(*commit)
        if not agree(error is None):
            raise error or CheckpointError(f"rank 0 failed to commit {final}")
        return final
    finally:
        for held in (partial, root):
            if held is not None:
                held.close()
        if lock is not None:
            lock.release()


def _start(save_dir: str, tag: str, token: int, final: str):
    """Rank 0 (step 1): ``(root, lock, partial, error)``; the caller closes and releases
    what was opened, also when ``error`` is set."""
    root = lock = None
    try:
        root = HeldDir.open(save_dir, create=True)
        lock = _SaveLock(root)
        _remove_leftovers(root)
        return root, lock, root.make_private(_partial_name(tag, token)), None
    except Exception as err:  # noqa: BLE001 - every rank must reach agree()
        return root, lock, None, _as_error(err, f"cannot start saving {final}")


def _try_commit(root, tag, partial, token, world_size, manifest_fields, save_latest):
    """Rank 0 (step 3): the error committing met (the partial directory removed), or None."""
    try:
        _commit(root, tag, partial, token, world_size, manifest_fields, save_latest)
    except Exception as err:  # noqa: BLE001 - every rank must reach agree()
        _discard(root, _partial_name(tag, token))
        return _as_error(err, f"committing checkpoint {os.path.join(root.path, tag)} failed")
    return None


def _discard(root: HeldDir | None, name: str) -> None:
    """Remove a save's own folder (after a failure: a full disk stays no fuller)."""
    if root is not None:
        root.discard(name)


def _partial_name(tag: str, token: int) -> str:
    return f".{tag}.partial-{token:016x}"


def _write_rank(partial, tag, rank, world_size, pieces, extra, rank_state) -> None:
    tensors: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    records = []
    for piece, by_kind in pieces:
        if "/" in piece.name:
            raise CheckpointError(f"parameter name {piece.name!r} contains '/'")
        for kind, t in by_kind.items():
            if t.numel() != piece.numel:
                raise CheckpointError(
                    f"{piece.name}/{kind}: tensor has {t.numel()} elements, piece says "
                    f"{piece.numel}"
                )
            dtype = str(t.dtype).removeprefix("torch.")
            if kinds.setdefault(kind, dtype) != dtype:
                raise CheckpointError(f"kind {kind!r} has several dtypes ({kinds[kind]}, {dtype})")
            key = f"{piece.name}/{kind}"
            if key in tensors:
                raise CheckpointError(f"rank {rank} holds two pieces of {piece.name}")
            tensors[key] = t.reshape(-1)
        records.append([piece.name, piece.offset, piece.numel])
    extra_meta = {}
    for name, t in extra.items():
        tensors[_EXTRA_PREFIX + name] = t
        extra_meta[name] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
    file_name = shard_file_name(rank, world_size)
    metadata = {"format": FORMAT, "rank": str(rank)}
    nbytes, crc = _write_shard(partial, file_name, tensors, metadata, _slow_save_seconds(tag))
    sidecar = {
        "rank": rank,
        "file": file_name,
        "bytes": nbytes,
        "crc32": crc,
        "kinds": kinds,
        "pieces": records,
        "extra": extra_meta,
        "state": jsonable.encode(rank_state, f"rank {rank} state"),
    }
    partial.write(_sidecar_name(rank), json.dumps(sidecar).encode())


def _commit(root, tag, partial, token, world_size, manifest_fields, save_latest) -> None:
    shards, states, kinds = [], [], {}
    for r in range(world_size):
        sidecar = json.loads(partial.read(_sidecar_name(r), MAX_SIDECAR_BYTES))
        states.append(sidecar.pop("state"))
        for kind, dtype in sidecar["kinds"].items():
            if kinds.setdefault(kind, dtype) != dtype:
                raise CheckpointError(f"ranks disagree on the dtype of {kind!r}")
        shards.append(sidecar)
    manifest = dict(manifest_fields() if manifest_fields else {})
    if "params" not in manifest:
        raise CheckpointError("manifest fields must describe the parameters ('params')")
    manifest.update(
        format=FORMAT,
        version=VERSION,
        tag=tag,
        world_size=world_size,
        created=time.time(),
        kinds=kinds,
        shards=shards,
        rank_state=states,
    )
    # The folder is private and not yet a checkpoint: the manifest needs no temporary name.
    partial.write(MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
    for r in range(world_size):
        os.unlink(_sidecar_name(r), dir_fd=partial.fd)
    partial.sync()
    name = _partial_name(tag, token)
    old = None
    if root.lstat(tag) is None:
        root.rename_new(name, tag)
    elif root.exchange(name, tag):
        old = name  # now holds what stood at <tag>: the previous checkpoint of this tag
    else:
        # Two renames: a crash between them leaves only .<tag>.old, which resolve_checkpoint
        # reads and the next save puts back.
        old = f".{tag}.old"
        root.remove(old)
        root.rename(tag, old)
        root.rename_new(name, tag)
    root.sync()
    if old is not None:
        _discard(root, old)
    if save_latest:
        root.replace(LATEST, (tag + "\n").encode("utf-8"))


# ---------------------------------------------------------------------------- load: locate
def read_latest(load_dir: str) -> str | None:
    """The tag ``load_dir/latest`` names, validated; None when there is no ``latest``.

    ``latest`` must be a small regular file: a link, a FIFO, a device or a folder in its
    place, or a file larger than `MAX_LATEST_BYTES`, is a CheckpointError naming it (never
    a read that blocks or fills memory, never a file elsewhere read through a link).
    """
    latest = os.path.join(os.path.abspath(load_dir), LATEST)
    try:
        with HeldDir.open(load_dir) as folder:
            info = folder.lstat(LATEST)
            if info is None:
                return None
            if not stat.S_ISREG(info.st_mode):
                kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
                raise CheckpointError(
                    f"{latest} is {kind}; it should be a small text file holding the tag of a "
                    "checkpoint: replace it with one (or load a checkpoint by its tag)"
                )
            text = folder.read(LATEST, MAX_LATEST_BYTES).decode("utf-8").strip()
    except FileNotFoundError:
        return None  # no folder: nothing saved there yet
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise CheckpointError(f"cannot read {latest}: {reason}") from None
    if not text:
        raise CheckpointError(f"{latest} is empty; it should hold the tag of a checkpoint")
    return validate_tag(text)


def resolve_checkpoint(load_dir: str, tag: str | None) -> str | None:
    """The directory of ``tag`` (default: the one ``latest`` names); None when no ``latest``.

    A ``latest`` naming a tag that does not exist, or a tag that is not a complete checkpoint,
    is a CheckpointError naming the file; so is a ``latest`` that is not a small regular file
    (`read_latest`).
    """
    load_dir = os.path.abspath(load_dir)
    if tag is None:
        latest = os.path.join(load_dir, LATEST)
        tag = read_latest(load_dir)
        if tag is None:
            return None
        path = _tag_dir(load_dir, tag)
        if not os.path.isdir(path):
            raise CheckpointError(
                f"{latest} names the checkpoint {tag!r}, but {path} does not exist; write the "
                "name of an existing checkpoint folder into that file (or load one by its tag)"
            )
    else:
        path = _tag_dir(load_dir, validate_tag(tag))
        if not os.path.isdir(path):
            raise CheckpointError(f"checkpoint {path} does not exist")
    if not os.path.isfile(os.path.join(path, MANIFEST)):
        raise CheckpointError(
            f"{path} has no {MANIFEST}: it is not a complete checkpoint (a save that did not "
            "finish?)"
        )
    return path


def _tag_dir(load_dir: str, tag: str) -> str:
    """``<tag>``, or ``.<tag>.old`` when a re-save crashed between its two renames."""
    path = os.path.join(load_dir, tag)
    old = os.path.join(load_dir, f".{tag}.old")
    if not os.path.exists(path) and os.path.isfile(os.path.join(old, MANIFEST)):
        return old
    return path


def iter_kinds(manifest: Mapping[str, Any]) -> Iterable[str]:
    return manifest.get("kinds", {}).keys()
