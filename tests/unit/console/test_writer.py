"""The console's background writer: never blocks its caller, drops rank lines (counted, then
reported) only while the reader is far behind, never drops zlaunch's own notes."""

from __future__ import annotations

import os
import threading
import time

from zlaunch.console.terminal import Console
from zlaunch.console.writer import BackgroundWriter


def _pipe():
    r, w = os.pipe()
    return os.fdopen(r, "rb", buffering=0), os.fdopen(w, "wb")


def test_writes_return_at_once_and_drop_only_rank_lines_while_the_reader_is_behind():
    reader, stream = _pipe()
    writer = BackgroundWriter(stream, limit=1000)
    line = b"x" * 99 + b"\n"
    started = time.monotonic()
    accepted = [writer.write(line) for _ in range(2000)]  # 200 kB into a 64 kB pipe, unread
    assert time.monotonic() - started < 2.0  # never blocked on the full pipe
    dropped = accepted.count(False)
    assert dropped > 0 and accepted[0]
    assert writer.write(b"zlaunch: a note\n", droppable=False)  # notes always get through

    received = bytearray()
    drain = threading.Thread(target=lambda: received.extend(reader.read()), daemon=True)
    drain.start()
    writer.close(timeout=10)
    stream.close()
    drain.join(10)
    text = received.decode()
    assert text.count("x" * 99) == 2000 - dropped
    assert "zlaunch: a note" in text
    assert f"{dropped} line(s) not shown here" in text  # said once the reader caught up


def test_a_reader_that_went_away_stops_the_rank_lines_quietly():
    reader, stream = _pipe()
    reader.close()
    writer = BackgroundWriter(stream)
    console = Console(color=False, out=writer, err=open(os.devnull, "w"))
    console.lines("node1", 0, "o", ["first"])
    assert writer.drain(timeout=5) and writer.broken
    console.lines("node1", 0, "o", ["second"])  # `zlaunch ... | head`: output stops, no error
    assert console.ranks == frozenset()
    assert not writer.write(b"more\n")
