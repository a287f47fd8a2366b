"""Frames from the agent to the controller: a non-blocking, buffered writer (stdlib only).

The agent never blocks on its stdout: a slow link must not stop the heartbeat check, and a
flood of output must not starve the exit handling. Frames wait in a buffer that the agent's
selector drains; past MAX_PENDING_OUTPUT the worker pipes stop being read (backpressure) until
the link catches up. A broken link (EPIPE) means the controller is gone.
"""

from __future__ import annotations

import errno
import os
import select
import selectors
import time
from collections.abc import Callable

from zlaunch.wire import frames

__all__ = ["Upstream", "MAX_PENDING_OUTPUT"]

# Stop reading worker pipes while this much output waits for a slow link (backpressure).
MAX_PENDING_OUTPUT = 32 * 1024 * 1024
WRITE_SIZE = 1024 * 1024
# A pipe's end gone (EPIPE), or a TCP connection to the controller (--connect) reset or timed out.
_LINK_GONE = (
    errno.EPIPE,
    errno.EBADF,
    errno.ECONNRESET,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
)


class Upstream:
    """The agent's stdout as a frame sink.

    ``on_lost(why)`` is called once when the controller's end is gone; ``on_backpressure``
    with True when too much waits to be written, with False once it has drained.
    """

    def __init__(
        self,
        fd: int,
        sel: selectors.BaseSelector,
        on_lost: Callable[[str], None],
        on_backpressure: Callable[[bool], None],
    ):
        self._fd = fd
        self._sel = sel
        self._on_lost = on_lost
        self._on_backpressure = on_backpressure
        self._buffer = bytearray()
        self._behind = False
        self.ok = True
        self.sent_at = time.monotonic()
        """When the last frame was queued for the controller (the agent's own heartbeat is
        due a second after)."""
        """The controller's end is still there; frames sent after it is gone are dropped."""

    def send(self, frame: frames.Frame) -> None:
        if not self.ok:
            return
        self._buffer += frames.encode(frame)
        self.sent_at = time.monotonic()
        self.flush()

    def flush(self) -> None:
        """Write what the link takes now; the selector calls again when it takes more."""
        while self._buffer and self.ok:
            try:
                n = os.write(self._fd, self._buffer[:WRITE_SIZE])
            except BlockingIOError:
                break
            except OSError as err:  # EPIPE: the controller is gone
                if err.errno in _LINK_GONE:
                    self.lost("controller connection closed")
                    return
                raise
            del self._buffer[:n]
        self._update_interest()

    def lost(self, why: str) -> None:
        self.ok = False
        self._buffer.clear()
        self._update_interest()
        self._on_lost(why)

    def flush_blocking(self, timeout: float = 5.0) -> None:
        """Last words before exit: a bounded wait, a stuck link must not keep us alive."""
        deadline = time.monotonic() + timeout
        while self._buffer and self.ok:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            _, writable, _ = select.select([], [self._fd], [], min(remaining, 0.5))
            if writable:
                self.flush()

    def _update_interest(self) -> None:
        want = bool(self._buffer) and self.ok
        registered = self._fd in self._sel.get_map()
        if want and not registered:
            self._sel.register(self._fd, selectors.EVENT_WRITE, "stdout")
        elif not want and registered:
            self._sel.unregister(self._fd)
        behind = len(self._buffer) > MAX_PENDING_OUTPUT
        if behind != self._behind:
            self._behind = behind
            self._on_backpressure(behind)
