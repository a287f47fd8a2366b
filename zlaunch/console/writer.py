"""Console output that never blocks the controller.

A reader that stops reading (``zlaunch ... | less`` left on its first page, a stalled log
collector) would block a plain ``write`` once the pipe is full, and with it the controller's
loop: a rank's death would no longer stop the others. `BackgroundWriter` hands the bytes to a
thread of its own instead. Rank lines beyond ``limit`` waiting bytes are dropped from the
console (every line is in the rank logs anyway) and counted; when the reader catches up, one
note says how many were not shown, and at the end (`close`) what is still unsaid; `dropped`
is the count for the whole job (`Console.close` says it on stderr). zlaunch's own notes are
never dropped. The queue, and with it the controller's memory, stays under ``limit`` bytes
whatever the ranks print.

Used for output that is not a terminal (pipes, files); a terminal is written directly, as the
live view needs.
"""

from __future__ import annotations

import collections
import threading
from typing import IO

__all__ = ["BackgroundWriter", "TextWriter", "DEFAULT_LIMIT"]

DEFAULT_LIMIT = 16 * 1024 * 1024


class BackgroundWriter:
    """Bytes to ``stream``, written by a daemon thread; `write` returns at once."""

    def __init__(self, stream: IO[bytes], limit: int | None = None):
        self.stream = stream
        self.limit = DEFAULT_LIMIT if limit is None else limit
        self._chunks: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._dropped_lines = 0
        self.dropped = 0
        """Rank lines dropped since the start (said or not)."""
        self._busy = False
        self._closed = False
        self.broken = False
        """The reader went away (EPIPE): everything after that is discarded."""
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="console-writer", daemon=True)
        self._thread.start()

    def write(self, data: bytes, *, droppable: bool = True) -> bool:
        """Queue ``data``; False when it was dropped (reader too far behind, or gone)."""
        with self._cond:
            if self.broken or self._closed:
                return False
            if droppable and self._queued >= self.limit:
                lines = data.count(b"\n")
                self._dropped_lines += lines
                self.dropped += lines
                return False
            self._chunks.append(data)
            self._queued += len(data)
            self._cond.notify()
        return True

    def flush(self) -> None:
        """Nothing to do here: the thread flushes after every write."""

    def isatty(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError):
            return False

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything queued is written (or the reader is gone)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.broken or (not self._chunks and not self._busy), timeout
            )

    def close(self, timeout: float | None = None) -> None:
        self.drain(timeout)
        with self._cond:  # drops not said yet (nothing came after them): said now
            if self._dropped_lines and not self.broken:
                self._chunks.append(b"")
                self._cond.notify()
        self.drain(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._chunks or self._closed)
                if not self._chunks:
                    return
                data = b"".join(self._chunks)
                self._chunks.clear()
                self._queued = 0
                dropped, self._dropped_lines = self._dropped_lines, 0
                self._busy = True
            if dropped:
                data += (
                    f"zlaunch: the console fell behind: {dropped} line(s) not shown here "
                    "(every line is in the rank logs: zlaunch logs)\n"
                ).encode()
            try:
                self.stream.write(data)
                self.stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                with self._cond:
                    self.broken = True
                    self._chunks.clear()
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class TextWriter:
    """A text face for a `BackgroundWriter` (zlaunch's notes: never dropped)."""

    def __init__(self, writer: BackgroundWriter, encoding: str = "utf-8"):
        self.writer = writer
        self.encoding = encoding

    def write(self, text: str) -> int:
        self.writer.write(text.encode(self.encoding, "backslashreplace"), droppable=False)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.writer.isatty()
