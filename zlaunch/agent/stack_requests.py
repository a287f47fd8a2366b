"""The stacks requests a node's workers have not answered yet, and when faulthandler stands in.

A worker armed by its boot dumps its stacks from a thread of its own under the GIL
(zlaunch/worker/stack_dumper.py) and says so with a ``stacks_dumped`` event. One that has not after
`FALLBACK_AFTER` seconds has its GIL held in C code: the agent then writes a marker line on
its stderr (who dumps, and why) and sends the fallback signal, on which faulthandler dumps
without the GIL. Pure bookkeeping: the caller gives the clock and does the signalling.
"""

from __future__ import annotations

from zlaunch.text import FAULTHANDLER, dump_marker
from zlaunch.worker import FALLBACK_AFTER

__all__ = ["StackRequests", "fallback_marker"]


def fallback_marker(pid: int, waited: float = FALLBACK_AFTER) -> str:
    """The line the agent writes on the rank's stderr before faulthandler's dump."""
    return dump_marker(
        pid,
        FAULTHANDLER,
        f"no answer from its stacks thread within {waited:g} s: a thread holds the GIL in C code",
    )


class StackRequests:
    """rank -> (pid asked, when): asked by the stacks thread, not answered yet."""

    def __init__(self, after: float = FALLBACK_AFTER) -> None:
        self.after = after
        self._asked: dict[int, tuple[int, float]] = {}

    def asked(self, rank: int, pid: int, now: float) -> None:
        if rank not in self._asked:  # a second request while one waits: the first one's clock
            self._asked[rank] = (pid, now)

    def answered(self, rank: int, pid: object) -> None:
        if rank in self._asked and self._asked[rank][0] == pid:
            del self._asked[rank]

    def forget(self, rank: int) -> None:
        """The rank exited: nobody to fall back for."""
        self._asked.pop(rank, None)

    def due(self, now: float) -> list[tuple[int, int]]:
        """(rank, pid) whose answer is overdue; they are taken off (one fallback each)."""
        late = [(r, pid) for r, (pid, at) in self._asked.items() if now - at >= self.after]
        for rank, _ in late:
            del self._asked[rank]
        return late

    def next_due(self, now: float) -> float | None:
        """Seconds until the next fallback is due, if any request waits."""
        if not self._asked:
            return None
        return max(0.0, min(at for _, at in self._asked.values()) + self.after - now)
