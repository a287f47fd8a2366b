"""Wait, bounded, until this process's gloo threads are idle (the worker boot's clean exit).

A gloo group's worker threads free a finished collective's objects a moment after it
completes, and that needs the GIL. If Python starts finalizing first, the thread that asks for
the GIL is unwound and C++ aborts the process (exit 134) after its work was done. The worker
boot's clean exit for scripts that do not use the runtime (``zlaunch/worker/group.py``) sleeps
here first: sleeping releases the GIL, so a thread that needs it gets it now. The threads are
watched through /proc (their scheduler state), since torch gives them no handle. The
runtime's own teardown (``runtime/distributed/teardown.py``) waits here too, after it destroyed
a group something still holds: one wait for both, in the ground both import.

Standard library only: it runs in workers that may never import torch.
"""

from __future__ import annotations

import os
import time

__all__ = ["wait_for_idle_gloo_threads", "gloo_thread_states"]

IDLE_LIMIT_S = 0.5  # an exiting process never waits longer than this
IDLE_POLLS = 5  # this many looks in a row (2 ms apart) with every gloo thread asleep: idle
GLOO_THREAD_NAMES = ("pt_gloo_runloop",)  # the name torch gives gloo's worker threads


def wait_for_idle_gloo_threads(limit_s: float = IDLE_LIMIT_S) -> None:
    """Sleep (releasing the GIL) until every gloo thread has slept for a few looks in a row."""
    deadline = time.monotonic() + limit_s
    idle = 0
    while idle < IDLE_POLLS and time.monotonic() < deadline:
        states = gloo_thread_states()
        if not states:
            return
        idle = idle + 1 if all(state == "S" for state in states) else 0
        time.sleep(0.002)


def gloo_thread_states() -> list[str]:
    """The scheduler state (R, S, D, ...) of each gloo worker thread of this process."""
    states = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return states  # no procfs: nothing to watch
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() not in GLOO_THREAD_NAMES:
                    continue
            with open(f"/proc/self/task/{tid}/stat") as f:
                # the state follows the parenthesised name, which may itself hold spaces
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # the thread ended while we looked
    return states
