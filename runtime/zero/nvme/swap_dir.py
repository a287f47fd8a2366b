"""The private directory a rank keeps its swap files in, under the config's `nvme_path`.

One directory per process (job run, rank, pid), mode 0700, removed when the swapper closes.
The files in it hold no name at all (`O_TMPFILE`, or created and unlinked at once where the
filesystem lacks it): the kernel frees their blocks when the process ends, also after a kill,
and no other user (nor a checkpoint loader looking at the directory) can ever open one. What a
killed process leaves is an empty directory with its `owner` note; the next start on the same
host removes those whose process is gone. Directories of other hosts (a shared `nvme_path`)
are left alone: their owners cannot be asked from here.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import shutil
import socket
import time

from runtime.errors import UsageError

__all__ = ["PREFIX", "SwapDir", "sweep_stale"]

# A dot name: listings of checkpoint directories (tags, `latest`) never show it.
PREFIX = ".zlaunch-swap-"
OWNER = "owner"
# How long a directory may stand without its owner note before a sweep calls it stale.
_NOTE_GRACE_S = 300


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, None when it does not exist: a pid
    alone is reused, the pair (pid, start) names one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count after its last ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _alive(owner: dict) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    return _start_ticks(pid) == owner.get("start")


def sweep_stale(nvme_path: str) -> list[str]:
    """Remove the swap directories under `nvme_path` that this host's dead processes left;
    returns the paths removed."""
    removed = []
    host = socket.gethostname()
    try:
        entries = list(os.scandir(nvme_path))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
            continue
        try:
            with open(os.path.join(entry.path, OWNER)) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            # No readable note: a process killed between mkdir and writing it, or one doing
            # that right now (another rank starting beside us). Only an old one is stale.
            try:
                if time.time() - entry.stat(follow_symlinks=False).st_mtime < _NOTE_GRACE_S:
                    continue
                os.rmdir(entry.path)
                removed.append(entry.path)
            except OSError:
                pass
            continue
        if not isinstance(owner, dict) or owner.get("host") != host or _alive(owner):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


class SwapDir:
    """This process's private directory under `nvme_path`, created at construction (after the
    stale ones of dead processes are swept) and removed by `close`."""

    def __init__(self, nvme_path: str, *, rank: int, run_id: str | None = None) -> None:
        if not isinstance(nvme_path, str) or not nvme_path:
            raise UsageError(f"nvme_path must be a directory path, got {nvme_path!r}")
        self.nvme_path = os.path.abspath(nvme_path)
        try:
            os.makedirs(self.nvme_path, exist_ok=True)
        except OSError as e:
            raise UsageError(
                f"nvme_path {self.nvme_path!r} cannot be created ({e.strerror}): point "
                "nvme_path at a writable directory on a local disk"
            ) from None
        sweep_stale(self.nvme_path)
        pid = os.getpid()
        run = "".join(c if c.isalnum() or c in "-_" else "_" for c in (run_id or "job"))[:40]
        self.path = os.path.join(self.nvme_path, f"{PREFIX}{run}-rank{rank}-{pid}")
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            # Same run, rank and pid: a dead process's whose pid came back, or a second
            # swapper in this process. Neither may share files with us.
            if _alive(self._owner()) and self._owner().get("pid") == pid:
                raise UsageError(
                    f"a swap directory {self.path!r} is already open in this process: close "
                    "the first swapper before opening another for the same rank"
                ) from None
            shutil.rmtree(self.path)
            os.mkdir(self.path, 0o700)
        except OSError as e:
            raise UsageError(
                f"nvme_path {self.nvme_path!r}: cannot create the swap directory ({e.strerror}); "
                "point nvme_path at a writable directory on a local disk"
            ) from None
        os.chmod(self.path, 0o700)  # mkdir's mode passes through the umask; this does not
        note = {"host": socket.gethostname(), "pid": pid, "start": _start_ticks(pid)}
        with open(os.path.join(self.path, OWNER), "w") as f:
            json.dump(note, f)
        self.closed = False
        # An engine has no close: the directory goes at interpreter exit (after a kill, the
        # next start's sweep removes it; the unnamed files are freed by the kernel either way).
        atexit.register(self.close)

    def _owner(self) -> dict:
        try:
            with open(os.path.join(self.path, OWNER)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def open_file(self) -> int:
        """A new read-write file in this directory that has no name (see the module doc)."""
        flags = os.O_RDWR | os.O_CLOEXEC
        try:
            return os.open(self.path, flags | os.O_TMPFILE, 0o600)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
        for i in range(1000):
            name = os.path.join(self.path, f"swap-{i}")
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            os.unlink(name)
            return fd
        raise OSError(errno.EEXIST, "no free swap file name", self.path)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            atexit.unregister(self.close)
            shutil.rmtree(self.path, ignore_errors=True)
