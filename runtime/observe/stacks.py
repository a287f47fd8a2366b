"""Every thread's Python stack on request, for finding where a job hangs (`zlaunch stacks`).

Under zlaunch, ``ZLAUNCH_STACKS_SIGNAL`` names a signal. In a worker started by zlaunch's boot,
the boot's stacks thread already answers it (zlaunch/worker/stack_dumper.py) and `install()` leaves
it be. Elsewhere (a Python process a wrapper script starts) `install()` registers `faulthandler`
to write the stack of every thread to stderr when it arrives (the dump runs in the C signal
handler, so it answers while Python is blocked inside a collective) and tells the agent, with
a ``stacks_ready`` event, that this rank can be asked. `runtime.initialize` calls it first,
before the process group exists, so a rank stuck in rendezvous can be seen too. Ranks that
never call it are never sent the signal (its default action would end them).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

__all__ = ["STACKS_SIGNAL_ENV", "install"]

from zlaunch.wire import STACKS_SIGNAL_ENV, events  # noqa: E402 - the shared names

_installed_on: int | None = None


def install(environ: dict[str, str] | None = None) -> bool:
    """Dump stacks on the zlaunch stacks signal; True when installed (now or before)."""
    global _installed_on
    environ = os.environ if environ is None else environ
    raw = environ.get(STACKS_SIGNAL_ENV, "")
    if not raw.isdigit():
        return False
    signum = int(raw)
    if _installed_on == signum:
        return True
    dumper = sys.modules.get("zlaunch.worker.stack_dumper")
    if dumper is not None and dumper.armed_on() == signum:
        return True  # the worker's boot dumps from a thread under the GIL: better than this
    # A child of a booted worker inherits the signal blocked (for the boot's stacks thread):
    # this process has no such thread, so it takes the signal itself.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
    # faulthandler installs its handler without SA_RESTART: a blocking call in C++ (the
    # TCP store's connect, a socket read) would fail with EINTR. Restart them instead.
    signal.siginterrupt(signum, False)
    _installed_on = signum
    from .metrics import EventSink

    sink = EventSink(environ)
    if sink.fd is not None:  # only zlaunch's agent reads it
        sink.emit(events.StacksReady(os.getpid()))  # the one to signal
    return True
