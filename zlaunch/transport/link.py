"""A started process on a host, whatever started it: the one kind of object every transport
returns (see the package's face for which transports there are)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from zlaunch.job import Host

__all__ = ["Link", "STDERR_TAIL_LINES"]

STDERR_TAIL_LINES = 40


class Link:
    """A started process on a host: write its stdin, read its stdout, keep its stderr's tail."""

    def __init__(self, host: Host):
        self.host = host
        self._send_lock = threading.Lock()
        self._stderr = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.closed = False

    # Implemented by the transports.
    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def read(self, size: int = 65536) -> bytes:
        """Blocking read of the process's stdout; b"" at the end."""
        raise NotImplementedError

    def close_stdin(self) -> None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status, or None if it has not ended within ``timeout``."""
        raise NotImplementedError

    def terminate(self, wait: float = 5.0) -> None:
        """End the process: EOF on its stdin (an agent then stops its workers), up to ``wait``
        seconds for it to exit, then drop it and the connection."""
        raise NotImplementedError

    def settle(self) -> None:
        """After ``terminate``: wait until what ending this link set going besides the agent is
        done (a scheduler deleting what it placed), so that what it says reaches the console
        before the job's end closes it. Most links end with the agent: nothing to wait for."""

    def running(self) -> bool:
        """Whether the started process still runs, as far as this end knows without asking
        the host: its exit status is not in. Cheap: the controller probes a silent agent
        with it while waiting for its hello (zlaunch/launcher/first_contact.py)."""
        return self.wait(0.0) is None

    def write(self, data: bytes) -> bool:
        """Thread-safe write; False when the other end is gone."""
        with self._send_lock:
            if self.closed:
                return False
            try:
                self._write(data)
                return True
            except OSError:
                return False

    def stderr_tail(self) -> list[str]:
        return list(self._stderr)

    def _collect_stderr(self, read: Callable[[], bytes]) -> None:
        partial = b""
        while True:
            try:
                chunk = read()
            except OSError:
                chunk = b""
            if not chunk:
                break
            partial += chunk
            *lines, partial = partial.split(b"\n")
            self._stderr.extend(line.decode("utf-8", "replace") for line in lines)
        if partial:
            self._stderr.append(partial.decode("utf-8", "replace"))

    def _start_stderr_thread(self, read: Callable[[], bytes]) -> None:
        threading.Thread(
            target=self._collect_stderr, args=(read,), name=f"stderr-{self.host.name}", daemon=True
        ).start()
