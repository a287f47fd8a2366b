"""Save when zlaunch asks, from a script that does not use the runtime (standard library only).

With ``--checkpoint-dir``, the first Ctrl-C (or ``zlaunch stop --save``) sends every rank the
save signal named in ``ZLAUNCH_SAVE_ON`` (SIGUSR1 unless ``--save-on``). Ranks that use
``runtime.initialize`` save at their next step and exit; any other script ignores the signal,
and zlaunch says so after a few seconds. A script can answer it itself::

    from zlaunch.save_request import SaveRequest

    save = SaveRequest()              # listens, if zlaunch asked for saves; else never set
    for step, batch in enumerate(loader):
        ...
        if save.agreed():             # every rank decides at the same step (one all-reduce)
            save_my_checkpoint(os.environ["ZLAUNCH_CHECKPOINT_DIR"])
            break

Creating it tells zlaunch nothing; the first signal does: the rank acknowledges the request
(an event to its agent), so zlaunch does not report a script that ignores it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping

from zlaunch.wire import EVENTS_FD_ENV, SAVE_ON_ENV, events

__all__ = ["SaveRequest"]


class SaveRequest:
    """A flag set by zlaunch's save signal; ``requested`` on this rank, ``agreed()`` on all."""

    def __init__(self, environ: Mapping[str, str] = os.environ):
        self.requested = False
        self.signum = _save_signal(environ.get(SAVE_ON_ENV, ""))
        self._events_fd = environ.get(EVENTS_FD_ENV, "")
        if self.signum is not None:
            signal.signal(self.signum, self._on_signal)
            self._event(events.SaveReady())  # a preemption notice may now be answered by a save

    def _on_signal(self, _signum: int, _frame: object) -> None:
        if not self.requested:
            self._event(events.SaveAck())
        self.requested = True

    def _event(self, event: events.SaveAck | events.SaveReady) -> None:
        fd = int(self._events_fd) if self._events_fd.isdigit() else None
        events.emit(fd, event)  # False: no agent to tell

    def agreed(self) -> bool:
        """True on every rank once any rank was asked: the ranks get the signal at slightly
        different steps, and a save is collective, so they agree through one all-reduce of the
        default process group (this rank's own flag when there is none)."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_initialized():
            return self.requested
        torch = sys.modules["torch"]
        backend = dist.get_backend()
        device = "cuda" if backend == "nccl" else "cpu"
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag)
        return bool(flag.item() > 0)


def _save_signal(name: str) -> int | None:
    name = name.strip().upper()
    if not name or name == "NONE":
        return None
    try:
        return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    except KeyError:
        return None
