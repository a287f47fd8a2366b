"""Frames exchanged between the controller and the per-node agents (stdlib only).

The kinds and every other shared name are in ``zlaunch/wire/protocol.py``.

Every frame is one JSON object on one line (``\\n``-terminated, UTF-8). The kind is in ``"t"``.
Each kind is a frozen dataclass below (:class:`Hello` ... :class:`Signal`, whose fields carry
the short wire keys); :func:`encode` and :func:`decode` are the only way between them and
bytes. Decoding checks every field: an unknown kind, a missing field or a field of the wrong
type raises ProtocolError naming the kind and the field. A field marked ``?`` may be absent;
keys a frame does not know are ignored.

Agent -> controller
    hello     {"t": "hello", "hostname", "pid", "python", "addr", "client_addr", "port"}
              ``addr`` is the server address of the SSH connection (how the other hosts reach
              this one; None for a local agent), ``client_addr`` the controller's address as this
              host sees it, ``port`` a TCP port that was free on ``addr`` (or 127.0.0.1).
    out       {"t": "out", "r": rank, "s": "o"|"e", "l": [line, ...], "p"?: true}  lines in
              order, without their newline; one frame carries what one read returned. With
              ``"p"`` the last line had no newline yet: it is a piece of a longer line (cut
              at MAX_PIECE_BYTES) or the unterminated end of the stream.
    started   {"t": "started", "r": rank, "pid": pid}
    exited    {"t": "exited", "r": rank, "pid": pid, "code": int|None, "signal": int|None}
    event     {"t": "event", "r": rank, "e": [object, ...]}  the worker's events, each an object
              with its kind in "kind" (zlaunch/wire/events.py)
    error     {"t": "error", "msg": text, "cause"?: text}  the agent could not do what it was
              asked; ``"cause": "no_heartbeat"``: it stopped its workers, cut off
    bye       {"t": "bye"}                    every worker of this agent is gone; agent exits

Controller -> agent
    spec      {"t": "spec", "cwd"?, "master_addr"?, "grace", "heartbeat_timeout", "env"?,
               "workers": [{"rank", "local_rank", "argv", "env"?}, ...]}  ``env`` is what
               every worker of the node shares (sent once); a worker's own ``env`` goes over it
    hb        {"t": "hb"}                     heartbeat; silence for ``heartbeat_timeout`` = lost
    stop      {"t": "stop", "grace": seconds} TERM every worker group, KILL after ``grace``
    signal    {"t": "signal", "sig": N, "ranks": [r, ...]?}  signal the worker processes
              themselves (not their groups): all of them, or only the ranks listed

Output bytes that are not valid UTF-8 survive the trip: lines are decoded with
``surrogateescape`` and JSON escapes the lone surrogates, so :func:`line_bytes` gives back the
original bytes.

No frame is longer than MAX_FRAME_BYTES: the agent cuts worker output into pieces small enough
that even the worst JSON escaping (6 bytes per invalid byte) stays far below it, and the
controller refuses a spec that would not fit before sending it. A reader that meets a longer
or garbled frame drops it (and reports how long it was, never its bytes, which may hold
secrets) and goes on with the next one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from zlaunch.wire import events
from zlaunch.wire.protocol import (
    BYE,
    ERROR,
    EVENT,
    EXITED,
    HEARTBEAT,
    HELLO,
    OUT,
    SIGNAL,
    SPEC,
    STARTED,
    STDERR,
    STDOUT,
    STOP,
)
from zlaunch.wire.records import (
    ENV,
    INT,
    INT_LIST,
    NUMBER,
    STR,
    STR_LIST,
    TRUE,
    FieldError,
    FieldType,
    dump,
    load,
    nullable,
    wire,
)

__all__ = [
    "ProtocolError",
    "Frame",
    "FRAME_TYPES",
    "Hello",
    "Out",
    "Started",
    "Exited",
    "Event",
    "Error",
    "Bye",
    "Spec",
    "WorkerSpec",
    "Heartbeat",
    "Stop",
    "Signal",
    "encode",
    "decode",
    "FrameReader",
    "LineSplitter",
    "MAX_FRAME_BYTES",
    "MAX_PIECE_BYTES",
    "line_text",
    "line_bytes",
    "exit_code_of",
]

# The longest frame a reader accepts; anything longer is dropped as a whole.
MAX_FRAME_BYTES = 8 * 1024 * 1024
# Worker output without a newline is forwarded in pieces once this much has gathered. With one
# read (256 KiB) on top and 6x escaping a frame stays under 2 MiB; the agent holds no more
# than this per pipe, however long the line.
MAX_PIECE_BYTES = 64 * 1024


class ProtocolError(ValueError):
    """A frame that does not decode: not JSON, an unknown kind, or a field missing or mistyped.

    The message names the kind and the field and gives the frame's length, never its bytes.
    """


_STREAM = FieldType(f"{STDOUT!r} or {STDERR!r}", lambda v: v in (STDOUT, STDERR))


# ---- frames -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Agent -> controller, first: where the agent runs and a port that was free there."""

    KIND: ClassVar[str] = HELLO
    hostname: str = wire("hostname", STR)
    pid: int = wire("pid", INT)
    python: str = wire("python", STR)
    addr: str | None = wire("addr", nullable(STR))
    client_addr: str | None = wire("client_addr", nullable(STR))
    port: int = wire("port", INT)
    cpus: int | None = wire("cpus", nullable(INT), omit_default=True, default=None)
    """The cores this agent may run on (its affinity): the ranks' thread default."""


@dataclass(frozen=True, slots=True)
class Out:
    """Lines a worker wrote on one stream; ``partial``: the last one has no newline yet."""

    KIND: ClassVar[str] = OUT
    rank: int = wire("r", INT)
    stream: str = wire("s", _STREAM)
    lines: list[str] = wire("l", STR_LIST)
    partial: bool = wire("p", TRUE, omit_default=True, default=False)


@dataclass(frozen=True, slots=True)
class Started:
    KIND: ClassVar[str] = STARTED
    rank: int = wire("r", INT)
    pid: int = wire("pid", INT)


@dataclass(frozen=True, slots=True)
class Exited:
    """A worker ended: with an exit ``code``, or killed by ``signal`` (never both)."""

    KIND: ClassVar[str] = EXITED
    rank: int = wire("r", INT)
    pid: int | None = wire("pid", nullable(INT))
    code: int | None = wire("code", nullable(INT))
    signal: int | None = wire("signal", nullable(INT))

    @classmethod
    def of_returncode(cls, rank: int, pid: int | None, returncode: int) -> Exited:
        """From a Popen return code, where -N means killed by signal N."""
        if returncode < 0:
            return cls(rank, pid, None, -returncode)
        return cls(rank, pid, returncode, None)

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.code, self.signal)


# An event the controller cannot take stands as an Invalid event in its place (the others of
# the frame are kept): a worker's events are decoded by its agent already, so this is a bug
# or an agent of another version, which the controller says rather than dropping the frame.
_EVENTS = FieldType(
    "a list of event objects",
    lambda v: isinstance(v, list),
    lambda v, _where: [event for item in v for event in events.accept(item)],
    lambda v: [events.encode(event) for event in v],
)


@dataclass(frozen=True, slots=True)
class Event:
    """Structured events of one worker (`zlaunch/wire/events.py`), in the order it wrote them."""

    KIND: ClassVar[str] = EVENT
    rank: int = wire("r", INT)
    events: list[events.WorkerEvent] = wire("e", _EVENTS)


@dataclass(frozen=True, slots=True)
class Error:
    """The agent could not do something; ``cause`` tells a cut-off node from a failure."""

    KIND: ClassVar[str] = ERROR
    msg: str = wire("msg", STR)
    cause: str | None = wire("cause", nullable(STR), omit_default=True, default=None)


@dataclass(frozen=True, slots=True)
class Bye:
    """Every worker of this agent is gone; the agent exits."""

    KIND: ClassVar[str] = BYE


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One worker of a spec; its ``env`` goes over the node's shared one."""

    rank: int = wire("rank", INT)
    local_rank: int = wire("local_rank", INT)
    argv: list[str] = wire("argv", STR_LIST)
    env: dict[str, str] = wire("env", ENV, default_factory=dict)


_WORKERS = FieldType(
    "a list of worker objects",
    lambda v: isinstance(v, list),
    lambda v, where: [load(WorkerSpec, item, f"{where}[{i}]") for i, item in enumerate(v)],
    lambda v: [dump(worker) for worker in v],
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """Controller -> agent, once: what to start on this node and how to stop it."""

    KIND: ClassVar[str] = SPEC
    cwd: str | None = wire("cwd", nullable(STR), default=None)
    master_addr: str | None = wire("master_addr", nullable(STR), default=None)
    grace: float = wire("grace", NUMBER)
    heartbeat_timeout: float = wire("heartbeat_timeout", NUMBER)
    env: dict[str, str] = wire("env", ENV, default_factory=dict)
    workers: list[WorkerSpec] = wire("workers", _WORKERS)
    preemption_signal: int | None = wire(
        "preemption_signal", nullable(INT), omit_default=True, default=None
    )
    """This signal to the agent is its host's preemption notice (said upstream; the workers
    keep running until the controller stops them); None: it stops the workers, as SIGTERM."""
    preemption_check: str | None = wire(
        "preemption_check", nullable(STR), omit_default=True, default=None
    )
    """A shell command the agent runs every ``preemption_check_interval`` seconds: exit 0 means
    the host is about to go (a preemption notice)."""
    preemption_check_interval: float = wire(
        "preemption_check_interval", NUMBER, omit_default=True, default=5.0
    )


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Controller -> agent, and echoed back: silence for ``heartbeat_timeout`` = lost."""

    KIND: ClassVar[str] = HEARTBEAT


@dataclass(frozen=True, slots=True)
class Stop:
    """TERM every worker group, KILL after ``grace`` seconds."""

    KIND: ClassVar[str] = STOP
    grace: float = wire("grace", NUMBER)


@dataclass(frozen=True, slots=True)
class Signal:
    """Signal the worker processes themselves (not their groups): all, or ``ranks`` only."""

    KIND: ClassVar[str] = SIGNAL
    sig: int = wire("sig", INT)
    ranks: list[int] | None = wire("ranks", nullable(INT_LIST), omit_default=True, default=None)


UpFrame = Union[Hello, Out, Started, Exited, Event, Error, Bye]
"""What an agent sends the controller."""
DownFrame = Union[Spec, Heartbeat, Stop, Signal]
"""What the controller sends an agent."""
Frame = Union[UpFrame, DownFrame]
FRAME_TYPES: dict[str, type[Frame]] = {
    cls.KIND: cls
    for cls in (Hello, Out, Started, Exited, Event, Error, Bye, Spec, Heartbeat, Stop, Signal)
}


def encode(frame: Frame) -> bytes:
    """One frame as one line of bytes. ``ensure_ascii`` keeps lone surrogates representable."""
    obj = {"t": frame.KIND, **dump(frame)}
    return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


def decode(line: bytes | str) -> Frame:
    """One frame from one line, checked field by field. Errors give the kind, the field and
    the length, never the bytes (a spec holds secrets)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError(f"not a JSON frame ({len(line)} bytes)") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise ProtocolError(f"frame without a kind ({len(line)} bytes)")
    if obj["t"] == OUT:
        out = _out_of(obj)
        if out is not None:
            return out
    cls = FRAME_TYPES.get(obj["t"])
    if cls is None:
        raise ProtocolError(f"unknown frame kind {obj['t'][:32]!r} ({len(line)} bytes)")
    try:
        return load(cls, obj, "")
    except FieldError as err:
        raise ProtocolError(f"{cls.KIND} frame ({len(line)} bytes): {err}") from None


def _out_of(obj: dict[str, Any]) -> Out | None:
    """The OUT frame, checked in a few C-speed tests (nearly every frame is one); None when a
    test fails: the general check then says which field is wrong."""
    rank, stream, lines = obj.get("r"), obj.get("s"), obj.get("l")
    partial = obj.get("p", False)
    if (
        type(rank) is int
        and (stream == STDOUT or stream == STDERR)
        and type(lines) is list
        and (partial is True or "p" not in obj)
        and _all_str(lines)
    ):
        return Out(rank, stream, lines, partial)
    return None


def _all_str(items: list[Any]) -> bool:
    return not items or set(map(type, items)) == {str}


def line_text(raw: bytes) -> str:
    """Bytes of one output line -> str that JSON can carry and :func:`line_bytes` can undo."""
    return raw.decode("utf-8", "surrogateescape")


def line_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class LineSplitter:
    """Cuts a byte stream into lines, keeping the unfinished tail for the next chunk.

    A tail longer than ``limit`` is handed out as it is, so memory stays bounded; ``partial``
    then says that the last line returned has no newline (the next one continues it).
    """

    __slots__ = ("_tail", "_limit", "partial")

    def __init__(self, limit: int = MAX_FRAME_BYTES) -> None:
        self._tail = b""
        self._limit = limit
        self.partial = False

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._tail + chunk if self._tail else chunk
        lines = data.split(b"\n")
        self._tail = lines.pop()
        self.partial = len(self._tail) > self._limit
        if self.partial:
            lines.append(self._tail)
            self._tail = b""
        return lines

    def has_return(self) -> bool:
        """The unfinished tail holds a carriage return (a progress bar redrawing its line)."""
        return b"\r" in self._tail

    def take_tail(self) -> bytes:
        """Hand out the unfinished tail now (it continues in the next line or piece)."""
        tail, self._tail = self._tail, b""
        return tail

    def finish(self) -> list[bytes]:
        """At end of stream: the last line if it had no newline (``partial`` then)."""
        tail, self._tail = self._tail, b""
        self.partial = bool(tail)
        return [tail] if tail else []


class FrameReader:
    """Incremental decoder for a stream of frames (bytes in, frames out).

    A frame longer than ``limit`` or one that does not decode raises ProtocolError, or, with
    ``on_bad``, is passed to it as a ProtocolError and skipped: one bad frame must not cost
    the frames after it.
    """

    def __init__(
        self,
        on_bad: Callable[[ProtocolError], None] | None = None,
        limit: int = MAX_FRAME_BYTES,
    ) -> None:
        self._lines = LineSplitter(limit)
        self._limit = limit
        self._on_bad = on_bad
        self._skipped = 0  # bytes of an over-long frame dropped so far; its end is still due

    def feed(self, chunk: bytes) -> Iterator[Frame]:
        return self._frames(self._lines.feed(chunk), end=False)

    def finish(self) -> Iterator[Frame]:
        return self._frames(self._lines.finish(), end=True)

    def _frames(self, lines: list[bytes], end: bool) -> Iterator[Frame]:
        cut = self._lines.partial and not end
        for index, line in enumerate(lines):
            unfinished = cut and index == len(lines) - 1
            if unfinished or self._skipped:
                self._skipped += len(line) + (0 if unfinished else 1)
                if not unfinished:
                    size, self._skipped = self._skipped, 0
                    self._bad(ProtocolError(f"frame of {size} bytes dropped (limit {self._limit})"))
                continue
            if not line.strip():
                continue
            if len(line) > self._limit:
                self._bad(
                    ProtocolError(f"frame of {len(line)} bytes dropped (limit {self._limit})")
                )
                continue
            try:
                frame = decode(line)
            except ProtocolError as err:
                self._bad(err)
                continue
            yield frame

    def _bad(self, err: ProtocolError) -> None:
        if self._on_bad is None:
            raise err
        self._on_bad(err)


def exit_code_of(code: int | None, signal: int | None) -> int:
    """The shell convention: a death by signal N is reported as 128+N."""
    if signal:
        return 128 + signal
    return code or 0
