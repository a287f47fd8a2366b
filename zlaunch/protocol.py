"""Frames exchanged between the controller and the per-node agents (stdlib only).

Every frame is one JSON object on one line (``\\n``-terminated, UTF-8). The kind is in ``"t"``.

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
    event     {"t": "event", "r": rank, "e": [object, ...]}  structured events from the worker
    error     {"t": "error", "msg": text}     the agent could not do what it was asked
    bye       {"t": "bye"}                    every worker of this agent is gone; agent exits

Controller -> agent
    spec      {"t": "spec", "cwd", "env", "workers": [{"rank", "local_rank", "argv", "env"}, ...],
               "master_addr", "grace", "heartbeat_timeout"}  ``env`` is what every worker of
               the node shares (sent once); a worker's own ``env`` goes over it
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
import signal
from collections.abc import Callable, Iterator
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
    "RUNTIME_READY",
    "PEAK_TFLOPS_ENV",
    "RUN_ID_ENV",
    "ATTEMPT_ENV",
    "CONFIG_ENV",
    "EVENTS_FD_ENV",
    "CHECKPOINT_DIR_ENV",
    "RESUME_ENV",
    "SAVE_ON_ENV",
    "TOTAL_STEPS_ENV",
    "JOB_ENV_NAMES",
    "SALLOC_ENV",
    "COLLECTIVE_TIMEOUT_ENV",
    "BATCH_ENV",
    "CAUSE_NO_HEARTBEAT",
    "STDOUT",
    "STDERR",
    "ProtocolError",
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
RUNTIME_READY = "runtime_ready"  # event kind: runtime.initialize finished (hang watch arms)
COLLECTIVE_TIMEOUT_ENV = "ZLAUNCH_COLLECTIVE_TIMEOUT"  # seconds, for init_process_group
CAUSE_NO_HEARTBEAT = "no_heartbeat"  # ERROR frame "cause": the agent stopped, cut off
BATCH_ENV = "ZLAUNCH_BATCH"  # "TRAIN_BATCH,MICRO,GAS" after a restart on another world size

# `zlaunch run --peak-tflops X`: the per-device peak (dense TFLOP/s) the runtime divides the
# measured FLOP rate by for MFU, instead of its table of known devices (runtime/profiling).
PEAK_TFLOPS_ENV = "ZLAUNCH_PEAK_TFLOPS"

# The environment zlaunch gives every worker and the runtime reads (plan.py sets the job's,
# the agent adds the events pipe): named here once, for both sides.
RUN_ID_ENV = "ZLAUNCH_RUN_ID"
ATTEMPT_ENV = "ZLAUNCH_ATTEMPT"
CONFIG_ENV = "ZLAUNCH_CONFIG"  # absolute path of the validated training config
EVENTS_FD_ENV = "ZLAUNCH_EVENTS_FD"  # write end of the pipe for JSON-line events
CHECKPOINT_DIR_ENV = "ZLAUNCH_CHECKPOINT_DIR"
RESUME_ENV = "ZLAUNCH_RESUME"  # "1": load the latest checkpoint at initialize
SAVE_ON_ENV = "ZLAUNCH_SAVE_ON"  # signal name: save at the next step and exit 0
TOTAL_STEPS_ENV = "ZLAUNCH_TOTAL_STEPS"  # the script's planned steps, for the live view's ETA

# `zlaunch --nodes N` on a login node re-runs itself under salloc with this set to "1": inside
# that allocation --nodes/--partition/--time/--account were already used (commands/run.py).
SALLOC_ENV = "ZLAUNCH_SALLOC"

# Every variable zlaunch sets for every worker (a user's value for one is overridden): the
# launcher conventions scripts read (torchrun's and DeepSpeed's) and zlaunch's own.
JOB_ENV_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "NUM_NODES",
        "GROUP_RANK",
        "CROSS_RANK",
        "CROSS_SIZE",
        "LOCAL_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        RUN_ID_ENV,
        ATTEMPT_ENV,
        CONFIG_ENV,
        EVENTS_FD_ENV,
        CHECKPOINT_DIR_ENV,
        RESUME_ENV,
        SAVE_ON_ENV,
        STACKS_SIGNAL_ENV,
        COLLECTIVE_TIMEOUT_ENV,
        BATCH_ENV,
    }
)

# The longest frame a reader accepts; anything longer is dropped as a whole.
MAX_FRAME_BYTES = 8 * 1024 * 1024
# Worker output without a newline is forwarded in pieces once this much has gathered. With one
# read (256 KiB) on top and 6x escaping a frame stays under 2 MiB; the agent holds no more
# than this per pipe, however long the line.
MAX_PIECE_BYTES = 64 * 1024


class ProtocolError(ValueError):
    """A frame that is not a JSON object with a string ``t``."""


def encode(frame: dict[str, Any]) -> bytes:
    """One frame as one line of bytes. ``ensure_ascii`` keeps lone surrogates representable."""
    return json.dumps(frame, separators=(",", ":")).encode("ascii") + b"\n"


def decode(line: bytes | str) -> dict[str, Any]:
    """One frame from one line. Errors give the length, never the bytes (a spec holds secrets)."""
    try:
        frame = json.loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError(f"not a JSON frame ({len(line)} bytes)") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("t"), str):
        raise ProtocolError(f"frame without a kind ({len(line)} bytes)")
    return frame


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

    def feed(self, chunk: bytes) -> Iterator[dict[str, Any]]:
        return self._frames(self._lines.feed(chunk), end=False)

    def finish(self) -> Iterator[dict[str, Any]]:
        return self._frames(self._lines.finish(), end=True)

    def _frames(self, lines: list[bytes], end: bool) -> Iterator[dict[str, Any]]:
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
