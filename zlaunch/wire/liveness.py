"""How long a silent peer is given, for the controller (its agents) and the agents (their
controller). Standard library only: the agents import it on every node.

Two rules, both about telling *busy* from *gone*:

- **Silence is counted only while the judge itself runs.** A process that was not scheduled
  (a loaded machine starting a thousand workers, a controller whose threads wait for the GIL)
  cannot blame its peer for the time it did not listen: ``SilenceClock.awake`` is called once
  per loop turn, and a turn that came later than it should have stops the clock for the excess.
  A peer whose link is really cut stays silent while the judge runs, and is found as before.
- **The allowance grows with the job.** One controller takes every line of every rank; the
  more ranks, the later its heartbeats can be on a busy machine, and the longer the path
  through a loaded sshd. ``heartbeat_timeout(ranks)`` is what the controller asks of its
  agents (5 s for a small job, the fault tests' expectation), and ``agent_silence_timeout``
  what it allows them in turn: longer, so a node found silent has already stopped its workers.
"""

from __future__ import annotations

__all__ = [
    "BASE_HEARTBEAT_TIMEOUT",
    "MAX_HEARTBEAT_TIMEOUT",
    "RANKS_PER_EXTRA_SECOND",
    "SMALL_JOB",
    "SilenceClock",
    "agent_silence_timeout",
    "heartbeat_timeout",
]

BASE_HEARTBEAT_TIMEOUT = 5.0
"""An agent that hears nothing from the controller this long stops its workers (small jobs)."""
SMALL_JOB = 64
"""Up to this many ranks, the base allowance."""
RANKS_PER_EXTRA_SECOND = 32
"""Beyond it, one more second per this many ranks."""
MAX_HEARTBEAT_TIMEOUT = 30.0
AGENT_SILENCE_MARGIN = 10.0
"""How much longer the controller waits for a silent agent than that agent waits for it."""


def heartbeat_timeout(ranks: int) -> float:
    """Seconds of silence from the controller after which an agent stops its workers: 5 s
    up to 64 ranks, +1 s per 32 ranks more (11 s at 256, 30 s from 864 on)."""
    extra = max(0, ranks - SMALL_JOB) / RANKS_PER_EXTRA_SECOND
    return min(MAX_HEARTBEAT_TIMEOUT, BASE_HEARTBEAT_TIMEOUT + extra)


def agent_silence_timeout(ranks: int) -> float:
    """Seconds of silence from an agent after which the controller takes its node as lost."""
    return heartbeat_timeout(ranks) + AGENT_SILENCE_MARGIN


class SilenceClock:
    """When each peer was last heard, on a clock that stops while the judge was not running.

    ``awake(now)`` once per turn of the judge's loop, which normally comes back within
    ``turn`` seconds; ``heard(peer, now)`` whenever bytes arrive from the peer (from any
    thread: a race loses a few microseconds, never a peer); ``silent_for(peer, now)``.
    Times are ``time.monotonic()`` values; the clock itself never reads one (pure, tested).
    """

    def __init__(self, peers: int, now: float, turn: float):
        self.turn = turn
        self.forgiven = 0.0
        """Seconds the judge spent not running beyond its turn, so far."""
        self.last_awake = now
        self._heard = [now] * peers  # on the judge's clock: real time minus ``forgiven``

    def awake(self, now: float) -> float:
        """The judge runs at ``now``: the time it was away beyond its turn does not count.
        Returns that time (0 for a turn on time)."""
        late = max(0.0, now - self.last_awake - self.turn)
        self.last_awake = max(self.last_awake, now)
        if late:
            self.forgiven += late
            # A peer heard while the judge was away was heard "now" on the judge's clock, not
            # in its future.
            present = now - self.forgiven
            for peer, heard in enumerate(self._heard):
                if heard > present:
                    self._heard[peer] = present
        return late

    def heard(self, peer: int, now: float) -> None:
        self._heard[peer] = now - self.forgiven

    def silent_for(self, peer: int, now: float) -> float:
        return max(0.0, now - self.forgiven - self._heard[peer])
