"""Local transport: the process runs as a child of the controller (hosts like ``localhost``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from zlaunch.errors import LaunchError
from zlaunch.job import Host
from zlaunch.transport.link import Link

__all__ = ["LocalLink"]


class LocalLink(Link):
    def __init__(self, host: Host, proc: subprocess.Popen):
        super().__init__(host)
        self.proc = proc
        self._stdout_fd = proc.stdout.fileno()
        self._start_stderr_thread(lambda: os.read(proc.stderr.fileno(), 65536))

    @classmethod
    def start(cls, host: Host, argv: Sequence[str]) -> LocalLink:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                bufsize=0,
                # Its own session: a terminal's Ctrl-C goes to the controller only, which then
                # stops the job in order; the agent still dies with us through EOF on stdin.
                start_new_session=True,
            )
        except OSError as err:
            raise LaunchError(f"cannot start {argv[0]!r} on {host.display}: {err}") from err
        return cls(host, proc)

    def _write(self, data: bytes) -> None:
        self.proc.stdin.write(data)

    def read(self, size: int = 65536) -> bytes:
        try:
            return os.read(self._stdout_fd, size)
        except OSError:
            return b""

    def close_stdin(self) -> None:
        with self._send_lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, wait: float = 5.0) -> None:
        # EOF first: the agent then stops its workers' groups itself, which a kill would skip.
        self.close_stdin()
        self.closed = True
        if self.wait(wait) is None:
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait()


def require_program(name: str, environ: Mapping[str, str], launcher: str, hint: str) -> str:
    """The path of ``name`` (srun, mpirun) on the environment's PATH, or a LaunchError that
    names the --launcher that needs it."""
    path = shutil.which(name, path=environ.get("PATH"))
    if path is None:
        raise LaunchError(f"--launcher {launcher}: {name} not found on PATH", hint=hint)
    return path
