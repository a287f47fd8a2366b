"""`zlaunch stacks` in a worker: every thread's stack, dumped by a thread of its own under the GIL.

faulthandler dumps from inside the signal handler and walks the interpreter's thread states
without the GIL: a thread that starts or ends meanwhile can crash the rank (SIGSEGV,
python/cpython#116008). On this machine a script that starts and ends threads in a loop died
in 10 of 10 runs within about a thousand dumps, on 3.10, 3.11 and 3.12 alike. So the worker's
boot arms this module instead (`arm`):

- the stacks signal is blocked in the main thread before the script starts, so every thread
  the script, torch or gloo starts later blocks it too, and a daemon thread takes it with
  ``sigwait``: no thread is interrupted by it, nothing it was doing sees EINTR;
- that thread formats ``sys._current_frames()`` while it holds the GIL, so no thread can
  appear, end or move under it, in faulthandler's format after a `dump_marker` line
  (zlaunch/text/stack_dumps.py reads both), writes it to stderr and tells the agent it answered
  (a ``stacks_dumped`` event);
- it answers while the main thread is blocked in C code that released the GIL (a collective,
  a socket read): only the GIL is needed, not the main thread;
- a rank whose GIL is never released (C code that holds it) cannot run that thread: its agent,
  after `FALLBACK_AFTER` seconds without the event, writes a marker saying so on the rank's
  stderr and sends ``STACKS_FALLBACK_SIGNAL``, on which faulthandler is registered here: then
  faulthandler answers, for a rank where no thread can start or end anyway.

The agent sends the stacks signal to the process (kill), not to its main thread, so that the
waiting thread can take it. ``ZLAUNCH_STACKS_DUMPER=faulthandler`` arms faulthandler on the
stacks signal itself instead, as before this thread existed. Stdlib only.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import types
from collections.abc import Mapping

from zlaunch.text import MAIN_DUMPER, THREAD_DUMPER, dump_marker
from zlaunch.wire import (
    EVENTS_FD_ENV,
    STACKS_DUMPER_ENV,
    STACKS_FALLBACK_SIGNAL,
    STACKS_SIGNAL_ENV,
    events,
)

__all__ = ["FALLBACK_AFTER", "MAX_DEPTH", "MAX_THREADS", "arm", "armed_on", "format_stacks"]

FALLBACK_AFTER = 2.0
"""Seconds the agent waits for the thread's answer before faulthandler stands in for it. A
busy rank hands over its GIL within milliseconds (every bytecode switch interval); a loaded
node's scheduler within a few hundred; a rank that has not in two seconds is held in C code."""
MAX_DEPTH = 100
"""Frames shown per thread, as faulthandler (then ``  ...``)."""
MAX_THREADS = 100
"""Threads shown, as faulthandler (then ``...``)."""

_armed: int | None = None


def armed_on() -> int | None:
    """The signal this process's stacks thread waits for, if it was armed (runtime/observe/stacks.py
    then leaves the signal alone)."""
    return _armed


def arm(environ: Mapping[str, str] = os.environ) -> bool:
    """Dump every thread's stack on the stacks signal from now on; tell the agent. True if
    armed. Call it from the main thread before any other thread starts."""
    global _armed
    raw = environ.get(STACKS_SIGNAL_ENV, "")
    if not raw.isdigit():
        return False
    signum = int(raw)
    events_fd = _events_fd(environ)
    if environ.get(STACKS_DUMPER_ENV, "") == "faulthandler":
        faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
        signal.siginterrupt(signum, False)  # blocking calls in C restart instead of failing
        events.emit(events_fd, events.StacksReady(os.getpid()))
        return True
    # faulthandler only for the agent's fallback; SA_RESTART so nothing sees EINTR from it
    faulthandler.register(STACKS_FALLBACK_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    signal.siginterrupt(STACKS_FALLBACK_SIGNAL, False)
    # Should the signal still reach a Python handler (a script unblocked it), the main thread
    # dumps: never the signal's default action, which ends the process.
    signal.signal(signum, lambda _s, _f: _dump(MAIN_DUMPER, events_fd))
    signal.siginterrupt(signum, False)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    # A forked child (a data loader's worker) has no stacks thread: the signal as Python
    # leaves it. (An exec'd child keeps the block: nothing sends it this signal.)
    os.register_at_fork(after_in_child=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum}))
    thread = threading.Thread(
        target=_wait_for_requests, args=(signum, events_fd), name="zlaunch-stacks", daemon=True
    )
    thread.start()
    _armed = signum
    events.emit(events_fd, events.StacksReady(os.getpid(), dumper="thread"))
    return True


def _wait_for_requests(signum: int, events_fd: int | None) -> None:
    while True:
        signal.sigwait({signum})  # without the GIL, until the agent asks
        try:
            _dump(THREAD_DUMPER, events_fd)
        except Exception:  # noqa: BLE001 - never end the rank over a diagnosis
            continue


def _dump(by: str, events_fd: int | None) -> None:
    # One look at every thread, under the GIL: the frames cannot change while it is held.
    frames = sys._current_frames()
    own = threading.get_ident() if by == THREAD_DUMPER else None
    lines = [dump_marker(os.getpid(), by)]
    lines += format_stacks(frames, threading.main_thread().ident, skip=own)
    _write_all(2, ("\n".join(lines) + "\n").encode("ascii", "backslashreplace"))
    events.emit(events_fd, events.StacksDumped(os.getpid()))


def format_stacks(
    frames: Mapping[int, types.FrameType], main: int | None, skip: int | None = None
) -> list[str]:
    """The threads' stacks in faulthandler's words, the main thread first (its "current"
    thread: the one the signal used to reach), most recent call first; ``skip``: the dumping
    thread itself, which is no part of where the rank stands."""
    lines: list[str] = []
    order = sorted((t for t in frames if t != skip), key=lambda t: t != main)
    for count, ident in enumerate(order):
        if count == MAX_THREADS:
            lines.append("...")
            break
        header = "Current thread" if ident == main else "Thread"
        lines.append(f"{header} 0x{ident:016x} (most recent call first):")
        frame: types.FrameType | None = frames[ident]
        depth = 0
        while frame is not None:
            if depth == MAX_DEPTH:
                lines.append("  ...")
                break
            code = frame.f_code
            line = frame.f_lineno
            lines.append(
                f'  File "{_plain(code.co_filename)}", line '
                f"{line if line is not None else '???'} in {_plain(code.co_name)}"
            )
            frame = frame.f_back
            depth += 1
        lines.append("")
    return lines


def _plain(text: str) -> str:
    """As faulthandler writes names: printable ASCII, anything else escaped (a file name
    holding a newline or an escape sequence cannot forge lines)."""
    if text.isascii() and text.isprintable():
        return text
    out = []
    for ch in text:
        if " " <= ch <= "~":
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return  # stderr closed: nobody to tell
        data = data[written:]


def _events_fd(environ: Mapping[str, str]) -> int | None:
    fd = environ.get(EVENTS_FD_ENV, "")
    return int(fd) if fd.isdigit() else None
