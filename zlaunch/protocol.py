"""Frames exchanged between the controller and the per-node agents (stdlib only).

Every frame is one JSON object on one line (``\\n``-terminated, UTF-8). The kind is in ``"t"``.

Agent -> controller
    hello     {"t": "hello", "hostname", "pid", "python", "addr", "client_addr", "port"}
              ``addr`` is the server address of the SSH connection (how the other hosts reach
              this one; None for a local agent), ``client_addr`` the controller's address as this
              host sees it, ``port`` a TCP port that was free on ``addr`` (or 127.0.0.1).
    out       {"t": "out", "r": rank, "s": "o"|"e", "l": [line, ...]}  complete lines, in order,
              without their newline; one frame carries as many lines as one read returned.
    started   {"t": "started", "r": rank, "pid": pid}
    exited    {"t": "exited", "r": rank, "pid": pid, "code": int|None, "signal": int|None}
    event     {"t": "event", "r": rank, "e": [object, ...]}  structured events from the worker
    error     {"t": "error", "msg": text}     the agent could not do what it was asked
    bye       {"t": "bye"}                    every worker of this agent is gone; agent exits

Controller -> agent
    spec      {"t": "spec", "cwd", "workers": [{"rank", "local_rank", "argv", "env"}, ...],
               "master_addr", "grace", "heartbeat_timeout"}
    hb        {"t": "hb"}                     heartbeat; silence for ``heartbeat_timeout`` = lost
    stop      {"t": "stop", "grace": seconds} TERM every worker group, KILL after ``grace``
    signal    {"t": "signal", "sig": N, "ranks": [r, ...]?}  signal the worker processes
              themselves (not their groups): all of them, or only the ranks listed

Output bytes that are not valid UTF-8 survive the trip: lines are decoded with
``surrogateescape`` and JSON escapes the lone surrogates, so :func:`line_bytes` gives back the
original bytes.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

__all__ = [
    "HELLO",
    "OUT",
    "STARTED",
    "EXITED",
    "EVENT",
    "ERROR",
    "BYE",
    "SPEC",
    "HEARTBEAT",
    "STOP",
    "SIGNAL",
    "STACKS_SIGNAL",
    "STACKS_SIGNAL_ENV",
    "STACKS_READY",
    "STDOUT",
    "STDERR",
    "ProtocolError",
    "encode",
    "decode",
    "FrameReader",
    "LineSplitter",
    "line_text",
    "line_bytes",
    "exit_code_of",
]

HELLO, OUT, STARTED, EXITED, EVENT, ERROR, BYE = (
    "hello",
    "out",
    "started",
    "exited",
    "event",
    "error",
    "bye",
)
SPEC, HEARTBEAT, STOP = "spec", "hb", "stop"
SIGNAL = "signal"  # controller -> agent: deliver {"sig": N} to every worker (or {"ranks": [...]})
STDOUT, STDERR = "o", "e"

# `zlaunch stacks`: sent to the controller, which forwards it to every rank whose runtime
# registered a stack dump on it (runtime/stacks.py). A real-time signal: no script or cluster
# tool uses it for something else, as they do SIGUSR1/2.
STACKS_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2
STACKS_SIGNAL_ENV = "ZLAUNCH_STACKS_SIGNAL"
STACKS_READY = "stacks_ready"  # event kind: this rank dumps its stacks on STACKS_SIGNAL

# A line longer than this without a newline is cut: the agent must not hold unbounded memory
# for one line. Anything shorter is never broken.
MAX_LINE_BYTES = 8 * 1024 * 1024


class ProtocolError(ValueError):
    """A frame that is not a JSON object with a string ``t``."""


def encode(frame: dict[str, Any]) -> bytes:
    """One frame as one line of bytes. ``ensure_ascii`` keeps lone surrogates representable."""
    return json.dumps(frame, separators=(",", ":")).encode("ascii") + b"\n"


def decode(line: bytes | str) -> dict[str, Any]:
    try:
        frame = json.loads(line)
    except ValueError as err:
        raise ProtocolError(f"not a JSON frame: {line[:200]!r}") from err
    if not isinstance(frame, dict) or not isinstance(frame.get("t"), str):
        raise ProtocolError(f"frame without a kind: {line[:200]!r}")
    return frame


def line_text(raw: bytes) -> str:
    """Bytes of one output line -> str that JSON can carry and :func:`line_bytes` can undo."""
    return raw.decode("utf-8", "surrogateescape")


def line_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class LineSplitter:
    """Cuts a byte stream into complete lines, keeping the unfinished tail for the next chunk."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._tail + chunk if self._tail else chunk
        lines = data.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > MAX_LINE_BYTES:
            lines.append(self._tail)
            self._tail = b""
        return lines

    def finish(self) -> list[bytes]:
        """At end of stream: the last line if it had no newline."""
        tail, self._tail = self._tail, b""
        return [tail] if tail else []


class FrameReader:
    """Incremental decoder for a stream of frames (bytes in, frames out)."""

    def __init__(self) -> None:
        self._lines = LineSplitter()

    def feed(self, chunk: bytes) -> Iterator[dict[str, Any]]:
        for line in self._lines.feed(chunk):
            if line.strip():
                yield decode(line)

    def finish(self) -> Iterator[dict[str, Any]]:
        for line in self._lines.finish():
            if line.strip():
                yield decode(line)


def exit_code_of(code: int | None, signal: int | None) -> int:
    """The shell convention: a death by signal N is reported as 128+N."""
    if signal:
        return 128 + signal
    return code or 0
