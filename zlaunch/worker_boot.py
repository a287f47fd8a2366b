"""Arms `zlaunch stacks` in any Python worker, then runs its script as ``python`` would.

The agent starts a Python worker as ``python -u -m zlaunch.worker_boot SCRIPT ARGS...`` (or
``... -m MODULE ARGS...``) instead of ``python -u SCRIPT ARGS...``. Before the script runs,
``faulthandler`` is registered on the stacks signal (``ZLAUNCH_STACKS_SIGNAL``), so every
thread's stack can be dumped even while the worker is blocked in C code, and the agent is told
(a ``stacks_ready`` event) that this rank can be asked, and torch's flight recorder is turned
on, with a thread that keeps the rank's recent collectives where the agent reads them
(zlaunch/collective_records.py): plain torch scripts and Hugging Face
Trainer jobs answer `zlaunch stacks` as runtime jobs do. No sitecustomize, no PYTHONSTARTUP:
nothing changes for other Python processes. Stdlib only; the script sees the ``sys.argv``,
``sys.path[0]``, ``__main__`` and ``__file__`` that ``python SCRIPT`` gives it.

Around the script, zlaunch/worker_group.py watches which process group the rank joins (said
to the agent as the script ends: a multi-rank job whose ranks each trained alone is reported)
and, once the script has returned, leaves a gloo group cleanly instead of to interpreter
teardown, which can abort a rank that has finished its work.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import signal
import sys
import types

from zlaunch.collective_records import start_watch
from zlaunch.protocol import EVENTS_FD_ENV, STACKS_READY, STACKS_SIGNAL_ENV
from zlaunch.worker_group import GroupWatch, leave_group, report_group


def arm_stacks(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Dump every thread's stack to stderr on the stacks signal; tell the agent. True if armed."""
    raw = environ.get(STACKS_SIGNAL_ENV, "")
    if not raw.isdigit():
        return False
    signum = int(raw)
    faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
    signal.siginterrupt(signum, False)  # blocking calls in C restart instead of failing (EINTR)
    fd = environ.get(EVENTS_FD_ENV, "")
    if fd.isdigit():
        try:
            os.write(
                int(fd), json.dumps({"kind": STACKS_READY, "pid": os.getpid()}).encode() + b"\n"
            )
        except OSError:
            pass
    return True


def _is_boot(filename: str) -> bool:
    return filename == __file__ or filename == "<frozen runpy>" or filename.endswith("runpy.py")


def strip_boot_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the script's own first frame: this module and runpy's left out."""
    while tb is not None and tb.tb_next is not None and _is_boot(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _excepthook(kind, value, tb) -> None:
    """An uncaught exception reads as under `python SCRIPT`: no boot frames on top."""
    tb = strip_boot_frames(tb)
    if isinstance(value, BaseException):
        value = value.with_traceback(tb)  # the default hook prints the exception's own
    sys.__excepthook__(kind, value, tb)


def _watch_group(environ: dict[str, str] | os._Environ = os.environ) -> GroupWatch | None:
    """Watch for the job's process group in a rank of a multi-rank job that can report it."""
    world = environ.get("WORLD_SIZE", "")
    if not world.isdigit() or int(world) < 2 or not environ.get(EVENTS_FD_ENV, "").isdigit():
        return None
    return GroupWatch(int(world)).start()


def main() -> None:
    args = sys.argv[1:]
    if not args:
        sys.exit("usage: python -m zlaunch.worker_boot SCRIPT [ARGS] | -m MODULE [ARGS]")
    arm_stacks()
    start_watch()  # the rank's recent collectives, for a hang report
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook
    watch = _watch_group()
    finished = False
    try:
        _run_script(args)
        finished = True
    except SystemExit as done:
        finished = done.code in (None, 0)
        raise
    finally:
        if watch is not None:
            report_group(watch.stop())
        if finished:
            leave_group()


def _run_script(args: list[str]) -> None:
    if args[0] == "-m" and len(args) > 1:
        sys.argv = [args[1], *args[2:]]  # runpy puts the module's path in argv[0]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = list(args)
    sys.path[0] = os.path.dirname(os.path.abspath(args[0]))  # as `python SCRIPT` sets it
    runpy.run_path(os.path.abspath(args[0]), run_name="__main__")  # __file__ absolute, as 3.9+


if __name__ == "__main__":
    main()
