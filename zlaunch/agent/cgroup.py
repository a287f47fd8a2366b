"""A cgroup (v2) per job where the agent may make one (stdlib only, Linux).

Everything a worker starts stays in the worker's cgroup whatever it does to its session,
process group or environment, so a cgroup of the job's own catches what the job tag cannot
(``setsid env -i prog &``), and the kernel kills all of it at once (``cgroup.kill``, Linux
5.14+; else each listed process). The agent makes one beneath its own cgroup when it may:
a cgroup2 hierarchy is mounted and the agent can create a directory there and move
processes into it (root, or a subtree delegated to the user, as systemd does for
``Delegate=yes`` units). Elsewhere (most SSH sessions, containers without delegation) it
makes none and the job tag and process groups do the work alone (zlaunch/agent/procs.py).

A worker moves itself in between fork and exec (it writes ``0`` to ``cgroup.procs``), so
nothing it starts is ever outside. The directory is removed when the agent ends; one left by
an agent that was killed is empty and harmless.
"""

from __future__ import annotations

import os
import signal

__all__ = ["JobCgroup", "cgroup2_dir"]

_MOUNTINFO = "/proc/self/mountinfo"
_OWN = "/proc/self/cgroup"


def cgroup2_dir() -> str | None:
    """This process's cgroup directory in the cgroup2 hierarchy, if one is mounted."""
    try:
        with open(_OWN) as handle:
            own = next((line[3:].strip() for line in handle if line.startswith("0::")), None)
        with open(_MOUNTINFO) as handle:
            mounts = handle.read().splitlines()
    except OSError:
        return None
    if own is None:
        return None
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] != ["cgroup2"] or len(fields) < 5:
            continue
        root, point = fields[3], fields[4]
        if own == root or own.startswith(root.rstrip("/") + "/"):
            path = os.path.join(point, own[len(root.rstrip("/")) :].lstrip("/"))
            return path if os.path.isdir(path) else None
    return None


class JobCgroup:
    """The job's cgroup on this node: made by `create`, joined by each worker, then ended."""

    def __init__(self, path: str):
        self.path = path
        self.procs = os.path.join(path, "cgroup.procs")

    @classmethod
    def create(cls, tag: str) -> JobCgroup | None:
        """A new cgroup ``zlaunch-<tag>`` under the agent's own, or None where it may not."""
        base = cgroup2_dir()
        if base is None:
            return None
        path = os.path.join(base, f"zlaunch-{tag}")
        try:
            os.mkdir(path, 0o755)
        except OSError:
            return None
        # Moving a process in needs write access here and in the source (the agent's) cgroup.
        if not (
            os.access(os.path.join(path, "cgroup.procs"), os.W_OK)
            and os.access(os.path.join(base, "cgroup.procs"), os.W_OK)
        ):
            _rmdir(path)
            return None
        return cls(path)

    def join(self) -> None:
        """Move the calling process in (runs in the forked worker, before exec)."""
        try:
            fd = os.open(self.procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError:
            pass  # not in the cgroup: the session and the job tag still find it

    def pids(self) -> list[int]:
        """Live (not zombie) processes in the cgroup."""
        try:
            with open(self.procs) as handle:
                listed = [int(line) for line in handle if line.strip()]
        except (OSError, ValueError):
            return []
        return [pid for pid in listed if _running(pid)]

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL and self._kill_all():
            return
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _kill_all(self) -> bool:
        try:
            fd = os.open(os.path.join(self.path, "cgroup.kill"), os.O_WRONLY)
        except OSError:
            return False  # before Linux 5.14
        try:
            os.write(fd, b"1")
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def remove(self) -> None:
        _rmdir(self.path)


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # still busy (an unkillable process), or gone


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
