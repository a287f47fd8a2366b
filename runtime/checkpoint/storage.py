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
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import secrets
import shutil
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import jsonable
from .errors import CheckpointError

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
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_RENAME_EXCHANGE = 2


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
def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create(path: str) -> int:
    """A new private file, opened for writing (an old one at ``path`` is replaced)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``path`` so that readers see the old or the new content, never a mix."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(_create(tmp), "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


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


def _serialize(tensors: Mapping[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """safetensors bytes of ``tensors``, straight from their memory (views may share storage)."""
    import safetensors

    keep, specs = [], {}
    for key, t in tensors.items():
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype not in _ST_DTYPES:
            raise CheckpointError(f"cannot store {key}: dtype {t.dtype} is not supported")
        keep.append(t)
        specs[key] = safetensors.TensorSpec(
            dtype=_ST_DTYPES[t.dtype],
            shape=list(t.shape),
            data_ptr=t.data_ptr(),
            data_len=t.numel() * t.element_size(),
        )
    data = bytes(safetensors.serialize(specs, metadata=metadata))
    del keep
    return data


def _write_file(path: str, data: bytes, slow_s: float) -> None:
    with open(_create(path), "wb") as f:
        if slow_s > 0:
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            os.fsync(f.fileno())
            time.sleep(slow_s)
            f.write(data[half:])
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------- save
class _SaveLock:
    """Rank 0's hold on a checkpoint directory for one save (flock: freed if it dies)."""

    def __init__(self, save_dir: str):
        self.path = os.path.join(save_dir, LOCK_FILE)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointError(
                f"another save into {save_dir} is in progress ({self.path} is locked): two "
                "jobs saving into one directory would mix their shards; give each job its own "
                "save_dir"
            ) from None
        except OSError:
            os.close(fd)
            raise
        self.fd = fd

    def release(self) -> None:
        os.close(self.fd)  # closing drops the flock


def _remove_leftovers(save_dir: str) -> None:
    """What crashed or failed saves left (rank 0, holding the lock: no save is running).

    Partial directories go. A ``.<tag>.old`` whose ``<tag>`` is missing is the only copy of
    that tag (a crash between the two renames of a re-save): it is put back, not removed.
    """
    for name in os.listdir(save_dir):
        path = os.path.join(save_dir, name)
        if not name.startswith(".") or not os.path.isdir(path):
            continue
        if ".partial" in name:
            shutil.rmtree(path, ignore_errors=True)
        elif name.endswith(".old"):
            tag = name[1 : -len(".old")]
            if tag and not os.path.exists(os.path.join(save_dir, tag)):
                os.rename(path, os.path.join(save_dir, tag))
            else:
                shutil.rmtree(path, ignore_errors=True)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where unsupported."""
    libc = _libc()
    renameat2 = getattr(libc, "renameat2", None) if libc is not None else None
    if renameat2 is None:
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False  # this file system cannot exchange: rename in two steps
    raise OSError(err, os.strerror(err), a)


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _as_error(err: BaseException, what: str) -> CheckpointError:
    """Any failure as the one error type, so that every rank reaches the agreement."""
    if isinstance(err, CheckpointError):
        return err
    text = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return CheckpointError(f"{what}: {text or type(err).__name__}")


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
    ``share``: a collective returning rank 0's argument on every rank; it names the partial
    directory uniquely. Without it (one process) the token is fixed; the lock still holds.
    """
    tag = validate_tag(tag)
    save_dir = os.path.abspath(save_dir)
    final = os.path.join(save_dir, tag)
    token = secrets.randbits(31) if rank == 0 and share is not None else 0
    lock, error = _start(save_dir, tag, token, final) if rank == 0 else (None, None)
    try:
        if not agree(error is None):
            raise error or CheckpointError(f"rank 0 could not start saving {final}")
        if share is not None:
            token = share(token)
        partial = _partial_path(save_dir, tag, token)
        try:
            _write_rank(partial, tag, rank, world_size, pieces, extra or {}, rank_state)
        except Exception as err:  # noqa: BLE001 - every rank must reach agree()
            text = err.strerror if isinstance(err, OSError) and err.strerror else err
            error = CheckpointError(f"rank {rank}: writing its shard in {partial} failed: {text}")
        if not agree(error is None):
            if rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            raise error or CheckpointError(
                f"another rank failed to write its shard of {tag}; nothing was committed and "
                f"{os.path.join(save_dir, LATEST)} is unchanged"
            )
        if rank == 0:
            commit = (save_dir, tag, partial, final, world_size, manifest_fields, save_latest)
            error = _try_commit(*commit)
        if not agree(error is None):
            raise error or CheckpointError(f"rank 0 failed to commit {final}")
        return final
    finally:
        if lock is not None:
            lock.release()


def _start(save_dir: str, tag: str, token: int, final: str):
    """Rank 0 (step 1): ``(lock, error)``; the lock, once taken, is released by the caller."""
    lock: _SaveLock | None = None
    try:
        os.makedirs(save_dir, mode=PRIVATE_DIR, exist_ok=True)
        lock = _SaveLock(save_dir)
        _remove_leftovers(save_dir)
        os.mkdir(_partial_path(save_dir, tag, token), PRIVATE_DIR)
    except Exception as err:  # noqa: BLE001 - every rank must reach agree()
        return lock, _as_error(err, f"cannot start saving {final}")
    return lock, None


def _try_commit(save_dir, tag, partial, final, world_size, manifest_fields, save_latest):
    """Rank 0 (step 3): the error committing met (the partial directory removed), or None."""
    try:
        _commit(save_dir, tag, partial, final, world_size, manifest_fields, save_latest)
    except Exception as err:  # noqa: BLE001 - every rank must reach agree()
        shutil.rmtree(partial, ignore_errors=True)
        return _as_error(err, f"committing checkpoint {final} failed")
    return None


def _partial_path(save_dir: str, tag: str, token: int) -> str:
    return os.path.join(save_dir, f".{tag}.partial-{token:08x}")


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
    data = _serialize(tensors, {"format": FORMAT, "rank": str(rank)})
    file_name = shard_file_name(rank, world_size)
    _write_file(os.path.join(partial, file_name), data, _slow_save_seconds(tag))
    sidecar = {
        "rank": rank,
        "file": file_name,
        "bytes": len(data),
        "crc32": zlib.crc32(data),
        "kinds": kinds,
        "pieces": records,
        "extra": extra_meta,
        "state": jsonable.encode(rank_state, f"rank {rank} state"),
    }
    with open(_create(os.path.join(partial, _sidecar_name(rank))), "w", encoding="utf-8") as f:
        json.dump(sidecar, f)
        f.flush()
        os.fsync(f.fileno())


def _commit(save_dir, tag, partial, final, world_size, manifest_fields, save_latest) -> None:
    shards, states, kinds = [], [], {}
    for r in range(world_size):
        path = os.path.join(partial, _sidecar_name(r))
        with open(path, encoding="utf-8") as f:
            sidecar = json.load(f)
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
    text = json.dumps(manifest, indent=1)
    atomic_write_text(os.path.join(partial, MANIFEST), text)
    for r in range(world_size):
        os.remove(os.path.join(partial, _sidecar_name(r)))
    fsync_dir(partial)
    old = None
    if not os.path.exists(final):
        os.rename(partial, final)
    elif _exchange(partial, final):
        old = partial  # now holds the previous checkpoint of this tag
    else:
        # Two renames: a crash between them leaves only .<tag>.old, which resolve_checkpoint
        # reads and the next save puts back.
        old = os.path.join(save_dir, f".{tag}.old")
        if os.path.exists(old):
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(partial, final)
    fsync_dir(save_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    if save_latest:
        atomic_write_text(os.path.join(save_dir, LATEST), tag + "\n")


# ---------------------------------------------------------------------------- load: locate
def resolve_checkpoint(load_dir: str, tag: str | None) -> str | None:
    """The directory of ``tag`` (default: the one ``latest`` names); None when no ``latest``.

    A ``latest`` naming a tag that does not exist, or a tag that is not a complete checkpoint,
    is a CheckpointError naming the file.
    """
    load_dir = os.path.abspath(load_dir)
    if tag is None:
        latest = os.path.join(load_dir, LATEST)
        if not os.path.isfile(latest):
            return None
        try:
            with open(latest, encoding="utf-8") as f:
                tag = f.read().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise CheckpointError(f"cannot read {latest}: {err}") from None
        if not tag:
            raise CheckpointError(f"{latest} is empty; it should hold the tag of a checkpoint")
        path = _tag_dir(load_dir, validate_tag(tag))
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
