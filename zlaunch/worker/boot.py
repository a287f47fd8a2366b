"""Arms `zlaunch stacks` in any Python worker, then runs its script as ``python`` would.

The agent starts a Python worker as ``python -u -c BOOT SCRIPT ARGS...`` (or ``... -m MODULE
ARGS...``) instead of ``python -u SCRIPT ARGS...``, where BOOT runs this module as ``-m`` would
but without the working directory on sys.path (zlaunch/worker/python_start.py): nothing in a shared
working directory is imported before the script, and the script gets the ``sys.path[0]`` that
``python SCRIPT`` gives it (`script_path_entry`), added only after the boot's own imports.
Before the script runs, the stacks thread is armed (zlaunch/worker/stack_dumper.py), so every
thread's stack can be dumped even while the script is blocked in C code, and the agent is told
(a ``stacks_ready`` event) that this rank can be asked, and torch's flight recorder is turned
on, with a thread that keeps the rank's recent collectives where the agent reads them
(zlaunch/worker/collective_records.py): plain torch scripts and Hugging Face Trainer jobs answer
`zlaunch stacks` as runtime jobs do. No sitecustomize, no PYTHONSTARTUP: nothing changes for
other Python processes. Stdlib only; the script sees the ``sys.argv``, ``sys.path[0]``,
``__main__`` and ``__file__`` that ``python SCRIPT`` gives it.

Around the script, zlaunch/worker/group.py watches which process group the rank joins (said
to the agent as the script ends: a multi-rank job whose ranks each trained alone is reported)
and, once the script has returned, leaves a gloo group cleanly instead of to interpreter
teardown, which can abort a rank that has finished its work.
"""

from __future__ import annotations

import os
import pkgutil  # runpy.run_path imports it late: here, before the script's folder is on sys.path
import runpy
import sys
import types

from zlaunch.wire import EVENTS_FD_ENV
from zlaunch.worker.argv import ArgsMismatch, restore
from zlaunch.worker.collective_records import start_watch
from zlaunch.worker.group import GroupWatch, leave_group, report_group
from zlaunch.worker.stack_dumper import arm


def _is_boot(filename: str) -> bool:
    """The boot's frames: its ``-c`` line (``<string>``), runpy's and this module's."""
    return filename in (__file__, "<string>", "<frozen runpy>") or filename.endswith("runpy.py")


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
    try:  # the script's arguments the agent kept off the command line (secret-looking)
        args = restore(sys.argv[1:])
    except ArgsMismatch as err:
        sys.exit(f"zlaunch.worker.boot: {err}")
    if not args:
        sys.exit("usage: python -m zlaunch.worker.boot SCRIPT [ARGS] | -m MODULE [ARGS]")
    arm()  # `zlaunch stacks`: before any thread starts, so each one inherits the signal mask
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


def script_path_entry(args: list[str], cwd: str, safe_path: bool = False) -> str | None:
    """What ``python SCRIPT`` (or ``python -m MODULE``) puts first on sys.path, which the boot
    (started without it: zlaunch/worker/python_start.py) adds only now, after its own imports: the
    script's directory with its links resolved, the working directory for a module, nothing
    with ``-P``/``PYTHONSAFEPATH``, nothing for a folder or zip (runpy adds it, as Python does)."""
    if safe_path:
        return None
    if args[0] == "-m":
        return cwd
    path = os.path.join(cwd, args[0])
    if pkgutil.get_importer(path) is not None:  # runpy's own test for a folder or a zip
        return None
    return os.path.dirname(os.path.realpath(path))


def _run_script(args: list[str]) -> None:
    entry = script_path_entry(args, os.getcwd(), bool(getattr(sys.flags, "safe_path", False)))
    if entry is not None:
        sys.path.insert(0, entry)
    if args[0] == "-m" and len(args) > 1:
        sys.argv = [args[1], *args[2:]]  # runpy puts the module's path in argv[0]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = list(args)
    runpy.run_path(os.path.abspath(args[0]), run_name="__main__")  # __file__ absolute, as 3.9+


if __name__ == "__main__":
    main()
