"""Worker pipes -> frames: output lines as OUT frames, structured events as EVENT frames.

One read becomes one frame, so the order of a stream's lines survives. A line without a
newline is held back until it ends or grows to frames.MAX_PIECE_BYTES (then it goes as a
piece, ``partial``); a line redrawn with carriage returns (a progress bar) is forwarded at most
every PROGRESS_INTERVAL, so the controller shows its latest state live. Events are JSON
objects, one a line; what does not parse (zlaunch/agent/events.py) is forwarded as an
``invalid`` event rather than lost. Stdlib only: it runs on every node.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable

from zlaunch.agent.events import parse_event
from zlaunch.agent.workers import EVENTS, Worker
from zlaunch.wire import events, frames

__all__ = ["OutputPump", "READ_SIZE", "PROGRESS_INTERVAL", "MAX_EVENT_BYTES"]

READ_SIZE = 256 * 1024
# A line redrawn with carriage returns (tqdm) is forwarded at most this often while it has no
# newline: the controller shows its latest state live; every byte still reaches the rank log.
PROGRESS_INTERVAL = 0.2
# One structured event longer than this is dropped (reported as an "invalid" event): events
# are small JSON objects, and a frame must stay below frames.MAX_FRAME_BYTES.
MAX_EVENT_BYTES = 1024 * 1024


class _Pipe:
    """One pipe of one worker: what its stream is, and what is left of its unfinished line."""

    __slots__ = ("rank", "stream", "splitter", "progress_sent", "dropping_event")

    def __init__(self, rank: int, stream: str):
        self.rank = rank
        self.stream = stream
        limit = MAX_EVENT_BYTES if stream == EVENTS else frames.MAX_PIECE_BYTES
        self.splitter = frames.LineSplitter(limit)
        self.progress_sent = 0.0
        """When its carriage-return tail was last forwarded."""
        self.dropping_event = 0
        """Bytes of an over-long event dropped so far (its end has not arrived yet)."""


class OutputPump:
    """Reads every worker pipe (non-blocking, from the agent's selector) and sends frames.

    ``pause`` stops reading while the link to the controller is behind (backpressure): the
    workers then block on their full pipes instead of the agent buffering without bound.
    """

    def __init__(self, sel: selectors.BaseSelector, send: Callable[[frames.Frame], None]):
        self._sel = sel
        self._send = send
        self._pipes: dict[int, _Pipe] = {}
        self.paused = False

    @property
    def open(self) -> bool:
        """Some pipe has not reached its end yet (a worker, or something it started, holds it)."""
        return bool(self._pipes)

    def watch(self, worker: Worker) -> None:
        for fd, stream in worker.pipes.items():
            os.set_blocking(fd, False)
            self._pipes[fd] = _Pipe(worker.rank, stream)
            if not self.paused:
                self._sel.register(fd, selectors.EVENT_READ, "pipe")

    def pause(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self.paused = paused
        for fd in self._pipes:
            if paused:
                self._sel.unregister(fd)
            else:
                self._sel.register(fd, selectors.EVENT_READ, "pipe")

    def drain(self, rank: int) -> None:
        """Everything a worker that has exited wrote: read to the end of what is there."""
        for fd in [fd for fd, pipe in self._pipes.items() if pipe.rank == rank]:
            self.read(fd, drain=True)

    def read(self, fd: int, drain: bool = False) -> None:
        """Read what is there; with ``drain``, keep reading until the pipe is empty."""
        pipe = self._pipes.get(fd)
        while pipe is not None:
            try:
                chunk = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            lines = pipe.splitter.feed(chunk) if chunk else pipe.splitter.finish()
            if lines:
                self._forward(pipe, lines, pipe.splitter.partial)
            if chunk and pipe.splitter.has_return():
                self._forward_progress(pipe, time.monotonic())
            if not chunk:
                self._close(fd)
                return
            if not drain:
                return

    def forward_due_progress(self, now: float) -> bool:
        """Forward the progress lines that are due; True if one is still held back."""
        waiting = False
        for pipe in list(self._pipes.values()):
            waiting = self._forward_progress(pipe, now) or waiting
        return waiting

    def _forward_progress(self, pipe: _Pipe, now: float) -> bool:
        """Forward a pipe's carriage-return tail (as a piece) if it is due; True if one waits."""
        if pipe.stream == EVENTS or not pipe.splitter.has_return():
            return False
        if now - pipe.progress_sent < PROGRESS_INTERVAL:
            return True
        pipe.progress_sent = now
        self._forward(pipe, [pipe.splitter.take_tail()], True)
        return False

    def _forward(self, pipe: _Pipe, lines: list[bytes], partial: bool) -> None:
        """Send one read's lines; ``partial``: the last one has no newline (yet)."""
        if pipe.stream != EVENTS:
            text = [frames.line_text(raw) for raw in lines]
            self._send(frames.Out(pipe.rank, pipe.stream, text, partial))
            return
        found = self._events(pipe, lines, partial)
        if found:
            self._send(frames.Event(pipe.rank, found))

    @staticmethod
    def _events(pipe: _Pipe, lines: list[bytes], partial: bool) -> list[events.WorkerEvent]:
        found: list[events.WorkerEvent] = []
        for index, raw in enumerate(lines):
            unfinished = partial and index == len(lines) - 1
            if unfinished or pipe.dropping_event:
                pipe.dropping_event += len(raw)
                if not unfinished:
                    size, pipe.dropping_event = pipe.dropping_event, 0
                    text = f"event of {size} bytes dropped (limit {MAX_EVENT_BYTES})"
                    found.append(events.Invalid(text))
                continue
            if not raw.strip():
                continue
            found.extend(parse_event(raw))
        return found

    def _close(self, fd: int) -> None:
        if self._pipes.pop(fd, None) is None:
            return
        if fd in self._sel.get_map():
            self._sel.unregister(fd)
        os.close(fd)
