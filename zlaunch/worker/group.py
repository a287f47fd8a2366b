"""A worker's process group, seen from zlaunch.worker.boot: who joined, and a clean way out.

Two things the launcher cannot learn from the outside:

* **Did this rank join the job?** A script can run N times side by side without ever forming
  a process group (a plain ``Accelerator()`` on a CPU-only machine does: accelerate only
  forms one there with ``cpu=True`` or ``ACCELERATE_USE_CPU=1``), and every rank then trains
  alone and exits 0 (accelerate there may even join the launcher's group and still train
  alone: its own state says how many processes it trains with, and is reported too).
  :class:`GroupWatch` looks, from a daemon thread, at whatever
  ``torch.distributed`` the script has imported (``sys.modules``; this module never imports
  torch) and keeps the largest default group it saw: a script that destroys its group before
  it returns, as nanoGPT does, still counts as having joined. The rank reports it in one
  event as the script ends (:data:`zlaunch.wire.protocol.PROCESS_GROUP_EVENT`).
* **Leaving gloo cleanly.** A gloo group left to interpreter teardown can kill a rank that has
  finished (SIGABRT, "terminate called without an active exception", exit 134): its worker
  threads free the last collective's objects late and ask for the GIL while Python is
  finalizing. :func:`leave_group` destroys a group still alive once the script has returned
  (no barrier, bounded) and waits, bounded, until gloo's threads are idle, while Python is
  still whole; not while a thread of the script that Python will wait for still runs. A
  group the script destroyed itself but still holds (DDP keeps a reference) gets the same
  wait.

Standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from zlaunch.wire import EVENTS_FD_ENV, events, wait_for_idle_gloo_threads

__all__ = ["GroupWatch", "accelerate_processes", "leave_group", "report_group"]

POLL_S = 0.02
# Before the script has started importing torch there is no group to see: look this seldom
# (importing torch takes longer than this, so the fast looks begin before any group can). A rank
# looking 50 times a second whatever it runs costs nothing alone, but a thousand idle ranks on a
# host (the scale benchmark) kept the machine busy enough to starve their agents' heartbeats.
NO_TORCH_POLL_S = 0.5
DESTROY_LIMIT_S = 10.0


def _dist() -> Any | None:
    """The script's torch.distributed once it is fully imported, else None (never imports)."""
    if "torch.distributed.distributed_c10d" not in sys.modules:
        return None
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and hasattr(dist, "is_initialized") else None


def _group_size() -> int:
    """The size of the default process group alive now (0: none)."""
    dist = _dist()
    try:
        return dist.get_world_size() if dist is not None and dist.is_initialized() else 0
    except Exception:  # noqa: BLE001 - destroyed between the two calls, or a backend's error
        return 0


class GroupWatch:
    """The largest default process group this process joined, watched while the script runs."""

    def __init__(self, expected: int, poll_s: float = POLL_S):
        self.expected = expected
        self.poll_s = poll_s
        self.largest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zlaunch-group-watch", daemon=True)

    def start(self) -> GroupWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s if "torch" in sys.modules else NO_TORCH_POLL_S):
            self.look()
            if self.largest >= self.expected:
                return  # joined the whole job: nothing more to learn

    def look(self) -> int:
        """Look once more (the script's end calls this too); the largest size so far."""
        self.largest = max(self.largest, _group_size())
        return self.largest

    def stop(self) -> int:
        self._stop.set()
        return self.look()


def accelerate_processes() -> int | None:
    """How many processes accelerate's state says the script trains with (None: accelerate
    not set up). On CPU it can join the launcher's group and still train alone (1)."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None)
    try:
        processes = shared.get("num_processes") if shared else None
    except Exception:  # noqa: BLE001 - an accelerate whose state reads otherwise
        return None
    return processes if isinstance(processes, int) else None


def report_group(largest: int, environ: Any = os.environ) -> None:
    """Tell the agent the largest group this rank joined and what accelerate made of it.

    Only a script that loaded torch is judged: a program that never touched it (a data
    preparation step, a shell tool, a progress bar) has no group to miss."""
    fd = environ.get(EVENTS_FD_ENV, "")
    if not fd.isdigit() or "torch" not in sys.modules:
        return
    event = events.ProcessGroup(largest, "accelerate" in sys.modules, accelerate_processes())
    events.emit(int(fd), event)  # False: the agent is gone, nobody to tell


def leave_group(destroy_limit_s: float = DESTROY_LIMIT_S) -> None:
    """After the script returned: destroy a default group still alive, then let gloo's threads
    fall idle, both bounded; a note on stderr when the group would not close."""
    dist = _dist()
    if dist is None or _threads_still_working():
        return
    try:
        alive = dist.is_initialized()
    except Exception:  # noqa: BLE001 - a torch that cannot say: leave it as it is
        return
    if alive:
        # In a thread: a group with a collective still posted would wait for peers that may
        # never post theirs; the script is done and must not hang on it.
        closer = threading.Thread(target=_destroy, args=(dist,), daemon=True)
        closer.start()
        closer.join(destroy_limit_s)
        if closer.is_alive():
            print(
                f"zlaunch: the script's process group did not close within {destroy_limit_s:g} s "
                "after the script ended (a collective still waiting for other ranks?)",
                file=sys.stderr,
            )
            return
    wait_for_idle_gloo_threads()


def _threads_still_working() -> bool:
    """Threads of the script that Python waits for at exit may still use the group: leave it
    to them (and to interpreter teardown, as without zlaunch)."""
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def _destroy(dist: Any) -> None:
    try:
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - the script is done; say what was left
        print(f"zlaunch: could not close the script's process group: {err}", file=sys.stderr)
