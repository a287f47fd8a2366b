"""Tensors kept in files: a thread pool over `os.preadv`/`os.pwritev`, no C++ build.

Each key owns one unnamed file in the rank's `SwapDir`. `write` and `read` return at once with
a `Pending`; the I/O runs on the pool in `block_size` requests (`workers` of them in flight),
so a caller reads the next group ahead and writes the previous group behind while it computes
on the current one. Operations on one key run in the order they were issued (a read issued
after a write sees that write); operations on different keys overlap.

Direct I/O (`O_DIRECT`) is used where the filesystem takes it: the data then goes from the
caller's buffer to the disk without a copy in the page cache. That matters for the job this
exists for: page cache is charged to the job's memory cgroup, and a model whose states are
several times that limit would otherwise push its own working set out. Direct I/O needs the
buffer address, the file offset and the length aligned to the disk's block; `aligned_buffer`
hands out page-aligned memory for that, and unaligned data (or a tail shorter than a block)
goes through a per-request aligned bounce buffer: correct always, fast when aligned.

Failures never leave data a caller could mistake for its own: a short read (the file shorter
than what was written to it) and a failed write (no space, file size limit) raise a
`SwapError` naming `nvme_path`, and a key whose last write failed refuses to be read until it is
written again in full. `allocate` reserves a key's blocks up front, so a disk too small for the
model stops the job at setup, not in the middle of a step.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from runtime.errors import UsageError
from runtime.zero.nvme.swap_dir import SwapDir

__all__ = ["ALIGN", "Pending", "SwapError", "SwapStats", "Swapper", "aligned_buffer"]

# The largest logical block size disks report; every direct request is aligned to it.
ALIGN = 4096
_SPACE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class SwapError(UsageError):
    """The swap files cannot hold or give back what was asked: the message names nvme_path."""


def aligned_buffer(nbytes: int) -> mmap.mmap:
    """Page-aligned anonymous memory of at least `nbytes` (rounded up to `ALIGN`): wrap it with
    `torch.frombuffer` for a tensor the swapper moves without a bounce copy."""
    return mmap.mmap(-1, max(ALIGN, _round_up(nbytes)))


def _round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _address_view(data) -> tuple[int, memoryview, object]:
    """(address, byte view, object to keep alive) of a contiguous CPU tensor or a buffer."""
    if hasattr(data, "data_ptr"):
        if data.device.type != "cpu" or not data.is_contiguous():
            raise UsageError("the swapper moves contiguous CPU tensors only")
        n = data.numel() * data.element_size()
        addr = data.data_ptr()
        raw = (ctypes.c_char * n).from_address(addr) if n else bytearray()
        return addr, memoryview(raw).cast("B"), data
    view = memoryview(data).cast("B")
    if view.readonly:
        copy = bytearray(view)
        view = memoryview(copy)
        data = copy
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view)) if len(view) else 0
    return addr, view, data


@dataclass
class SwapStats:
    """Bytes moved and the wall time the pool's requests spent moving them (summed over
    requests: divided by `workers` it bounds the wall time the I/O took)."""

    bytes_read: int = 0
    bytes_written: int = 0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str, nbytes: int, seconds: float) -> None:
        with self.lock:
            if kind == "read":
                self.bytes_read += nbytes
                self.read_seconds += seconds
            else:
                self.bytes_written += nbytes
                self.write_seconds += seconds


class Pending:
    """One read or write in flight: `wait()` returns when all its requests are done and raises
    the first error one of them met."""

    def __init__(self, parts: int, keep, on_done=None) -> None:
        self._left = parts
        self._on_done = on_done
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._keep = keep  # the caller's buffer stays alive while the pool uses its address
        if parts == 0:
            self._done.set()

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            last = self._left == 0
        if last:
            self._keep = None
            if self._on_done is not None:
                self._on_done(self._error)  # before anyone waiting on this one runs
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error


@dataclass
class _Entry:
    fd: int
    nbytes: int = 0  # what the last complete write left in the file
    capacity: int = 0  # bytes reserved by allocate, ALIGN-rounded
    last: Pending | None = None  # the latest operation issued: the next one runs after it
    failed: BaseException | None = None  # the last write's error: the contents are lost


class Swapper:
    """Keys to files in `directory`, moved by a pool of `workers` threads in requests of
    `block_size` bytes. `direct`: None uses O_DIRECT where the filesystem takes it, True
    requires it, False never uses it."""

    def __init__(
        self,
        directory: SwapDir,
        *,
        workers: int = 8,
        block_size: int = 1 << 20,
        direct: bool | None = None,
    ) -> None:
        if workers < 1:
            raise UsageError(f"the swapper needs at least one I/O thread, got {workers}")
        if block_size < ALIGN or block_size % ALIGN:
            raise UsageError(
                f"aio.block_size must be a positive multiple of {ALIGN}, got {block_size}"
            )
        self.directory = directory
        self.block_size = block_size
        self.workers = workers
        self.stats = SwapStats()
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="zlaunch-swap")
        self._bounce = threading.local()
        self.direct = self._probe_direct() if direct is not False else False
        if direct and not self.direct:
            raise SwapError(
                f"nvme_path {directory.nvme_path!r} does not take direct I/O (O_DIRECT): use a "
                "directory on a block-device filesystem (ext4, xfs), or allow buffered I/O"
            )
        self._closed = False

    def _probe_direct(self) -> bool:
        fd = self.directory.open_file()
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
            buf = aligned_buffer(ALIGN)
            os.pwritev(fd, [buf], 0)
            os.preadv(fd, [buf], 0)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def _space_error(self, key: str, nbytes: int, e: OSError) -> SwapError:
        try:
            st = os.statvfs(self.directory.nvme_path)
            free = f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB free there"
        except OSError:
            free = "free space unknown"
        return SwapError(
            f"nvme_path {self.directory.nvme_path!r} cannot hold {key!r} ({nbytes} bytes): "
            f"{e.strerror} ({free}); free space there, raise the file size limit, or point "
            "nvme_path at a larger disk"
        )

    def _entry(self, key: str) -> _Entry:
        with self._lock:
            if self._closed:
                raise UsageError("the swapper is closed")
            entry = self._entries.get(key)
            if entry is None:
                fd = self.directory.open_file()
                if self.direct:
                    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
                entry = self._entries[key] = _Entry(fd)
            return entry

    def allocate(self, key: str, nbytes: int) -> None:
        """Reserve the blocks `key` will hold now, so no later write of it runs out of space;
        a disk too small raises a `SwapError` here and leaves no file of `key` behind."""
        entry = self._entry(key)
        size = _round_up(nbytes)
        if size <= entry.capacity:
            return
        try:
            os.posix_fallocate(entry.fd, 0, size)
        except OSError as e:
            if e.errno in _SPACE_ERRNOS:
                self._drop(key)
                raise self._space_error(key, nbytes, e) from None
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.ftruncate(entry.fd, size)  # no preallocation here: writes will find out
        entry.capacity = size

    def _drop(self, key: str) -> None:
        with self._lock:
            entry = self._entries.pop(key)
        if entry.last is not None:
            entry.last._done.wait()
        os.close(entry.fd)

    def nbytes(self, key: str) -> int:
        """What the last complete write of `key` holds."""
        return self._entries[key].nbytes

    def write(self, key: str, data) -> Pending:
        """Write `data` (a contiguous CPU tensor or a writable buffer) as the whole of `key`.
        The caller must not change `data` until the returned `Pending` is done."""
        entry = self._entry(key)
        addr, view, keep = _address_view(data)
        nbytes = len(view)
        return self._submit(key, entry, "write", addr, view, keep, nbytes)

    def read(self, key: str, out) -> Pending:
        """Read `key` into `out` (a contiguous CPU tensor or writable buffer of the size last
        written). Runs after every operation on `key` issued before it."""
        entry = self._entries.get(key)
        if entry is None:
            raise UsageError(f"swap key {key!r} was never written")
        addr, view, keep = _address_view(out)
        if len(view) != entry.nbytes:
            raise UsageError(
                f"swap key {key!r} holds {entry.nbytes} bytes; the buffer to read it into has "
                f"{len(view)}"
            )
        return self._submit(key, entry, "read", addr, view, keep, len(view))

    def _submit(self, key, entry, kind, addr, view, keep, nbytes) -> Pending:
        starts = range(0, nbytes, self.block_size)

        def written(error):
            # A clean write makes the key whole again; a failed one loses its contents.
            entry.failed = error

        pending = Pending(len(starts), keep, written if kind == "write" else None)
        before = entry.last
        entry.last = pending
        if kind == "write":
            # Any reader after this write must find this size, or this write's error.
            entry.nbytes = nbytes
        for start in starts:
            end = min(start + self.block_size, nbytes)
            self._pool.submit(self._run, key, entry, kind, before, addr, view, start, end, pending)
        if kind == "write" and not starts:
            entry.failed = None
        return pending

    def _run(self, key, entry, kind, before, addr, view, start, end, pending) -> None:
        # The pool runs requests in the order they were queued, so every request of `before`
        # was taken by a thread before this one: waiting on it cannot deadlock.
        error = None
        try:
            if before is not None:
                before._done.wait()
            if kind == "read" and entry.failed is not None:
                raise SwapError(
                    f"swap key {key!r} cannot be read: its last write failed "
                    f"({entry.failed}); its contents are lost"
                )
            t0 = time.perf_counter()
            if kind == "write":
                self._write_range(entry.fd, addr, view, start, end)
            else:
                self._read_range(key, entry.fd, addr, view, start, end)
            self.stats.add(kind, end - start, time.perf_counter() - t0)
        except OSError as e:
            error = (
                self._space_error(key, entry.nbytes, e)
                if e.errno in _SPACE_ERRNOS
                else SwapError(
                    f"swap {kind} of {key!r} under nvme_path {self.directory.nvme_path!r} "
                    f"failed: {e.strerror or e}"
                )
            )
        except BaseException as e:  # noqa: BLE001 - handed to the waiter, never lost
            error = e
        pending._finish(error)

    def _bounce_buffer(self) -> mmap.mmap:
        buf = getattr(self._bounce, "buf", None)
        if buf is None:
            buf = self._bounce.buf = aligned_buffer(self.block_size)
        return buf

    def _direct_ok(self, addr: int, start: int, end: int) -> bool:
        return not self.direct or ((addr + start) % ALIGN == 0 and (end - start) % ALIGN == 0)

    def _write_range(self, fd, addr, view, start, end) -> None:
        if self._direct_ok(addr, start, end):
            _pwrite_all(fd, view[start:end], start)
            return
        n = end - start
        bounce = memoryview(self._bounce_buffer())
        bounce[:n] = view[start:end]
        padded = _round_up(n)
        bounce[n:padded] = bytes(padded - n)
        _pwrite_all(fd, bounce[:padded], start)

    def _read_range(self, key, fd, addr, view, start, end) -> None:
        if self._direct_ok(addr, start, end):
            got = _pread_all(fd, view[start:end], start)
            if got < end - start:
                raise self._short(key, start + got, end)
            return
        n = end - start
        bounce = memoryview(self._bounce_buffer())
        got = _pread_all(fd, bounce[: _round_up(n)], start)
        if got < n:
            raise self._short(key, start + got, end)
        view[start:end] = bounce[:n]

    def _short(self, key: str, have: int, want: int) -> SwapError:
        return SwapError(
            f"swap file of {key!r} under nvme_path {self.directory.nvme_path!r} ends at byte "
            f"{have}, {want - have} bytes short of what was written: something truncated it; "
            "its contents are lost"
        )

    def wait_all(self) -> None:
        """Wait for every operation issued; raise the first error one met."""
        errors = []
        for entry in list(self._entries.values()):
            if entry.last is not None:
                try:
                    entry.last.wait()
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Finish what is in flight, close every file (the kernel frees their blocks) and
        remove the swap directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True)
        for entry in self._entries.values():
            os.close(entry.fd)
        self._entries.clear()
        self.directory.close()

    def __enter__(self) -> Swapper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.pwritev(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, "write returned no progress")
        done += n


def _pread_all(fd: int, view: memoryview, offset: int) -> int:
    """Bytes read: fewer than asked only at the end of the file. Partial reads are retried."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done
