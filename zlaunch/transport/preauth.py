"""What the connect-back listener keeps of connections that have not proven the job's token yet
(transport/connect_back.py): the table of pending peers and the tally of refusals. Pure: no
sockets are read or written here and time is the caller's, so the listener's policy is
unit-tested without a network.

The port is visible to every user of the machine (/proc/net/tcp) and anyone may connect, so
what a stranger costs is bounded before anything is known about it:

* **time**: a peer's deadline counts from its accept, never from when the listener gets to it;
* **bytes**: at most one answer line (``connect_handshake.MAX_LINE``) is read from a peer, and
  a byte past its newline is a refusal of an answer that is otherwise right (an agent says
  nothing more before the controller's proof);
* **room**: at most ``cap`` peers wait at once. A new connection over the cap sheds the oldest
  waiting one: a real agent answers within a round trip of its accept, so the oldest peer is
  the one least likely to be an agent, and a flood of strangers can delay an agent (which then
  tries again) but never hold its place.

Refusals are told to the user, but not one line per stranger: the first few in full, then one
summary by kind and address when the wait ends.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from zlaunch.wire import MAX_LINE, HandshakeError

__all__ = ["Pending", "PendingPeers", "Refusal", "RefusalTally"]


@dataclass
class Pending:
    """One accepted connection waiting for its answer line."""

    key: int
    """The listener's name for it (its descriptor)."""
    conn: object
    peer: str
    challenge: str
    """The nonce this peer was sent (its answer must be over it)."""
    deadline: float
    """Accept time plus the pre-auth timeout (monotonic)."""
    received: bytearray = field(default_factory=bytearray)


class PendingPeers:
    """Connections accepted and not yet authenticated, in accept order (which is also deadline
    order: every peer gets the same time from its accept)."""

    def __init__(self, cap: int, timeout: float):
        if cap < 1:
            raise ValueError(f"cap must be at least 1, got {cap}")
        self.cap = cap
        self.timeout = timeout
        self._peers: collections.OrderedDict[int, Pending] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._peers)

    def __iter__(self) -> Iterator[Pending]:
        return iter(list(self._peers.values()))

    @property
    def full(self) -> bool:
        return len(self._peers) >= self.cap

    def add(self, key: int, conn: object, peer: str, challenge: str, accepted: float) -> Pending:
        if key in self._peers:  # a descriptor is reused only after it was removed here
            raise ValueError(f"peer {key} is pending already")
        entry = Pending(key, conn, peer, challenge, accepted + self.timeout)
        self._peers[key] = entry
        return entry

    def remove(self, key: int) -> Pending | None:
        return self._peers.pop(key, None)

    def oldest(self) -> Pending | None:
        return next(iter(self._peers.values()), None)

    def expired(self, now: float) -> list[Pending]:
        """Every peer whose deadline has passed, removed from the table."""
        gone: list[Pending] = []
        while self._peers:
            entry = next(iter(self._peers.values()))
            if entry.deadline > now:
                break
            gone.append(self._peers.popitem(last=False)[1])
        return gone

    def next_deadline(self) -> float | None:
        entry = self.oldest()
        return None if entry is None else entry.deadline

    def shrink_to(self, size: int) -> None:
        """Hold at most ``size`` peers from now on (the descriptors ran out at this many)."""
        self.cap = max(1, min(self.cap, size))

    @staticmethod
    def room(entry: Pending) -> int:
        """How many more bytes may be read from ``entry``: up to one byte past a full line,
        which tells a line that is too long from one that is not finished."""
        return MAX_LINE + 1 - len(entry.received)

    @staticmethod
    def feed(entry: Pending, data: bytes) -> bytes | None:
        """Take ``data`` read from ``entry``: its answer line (without the newline) once whole,
        None while it is not; HandshakeError for a line over MAX_LINE."""
        entry.received += data
        end = entry.received.find(b"\n")
        if end < 0:
            if len(entry.received) > MAX_LINE:
                raise HandshakeError(f"handshake line longer than {MAX_LINE} bytes")
            return None
        return bytes(entry.received[:end])

    @staticmethod
    def check_alone(entry: Pending) -> None:
        """HandshakeError if ``entry`` sent bytes past its answer line: an agent says nothing
        more before the controller's proof, and what follows would be taken for frames."""
        if entry.received.find(b"\n") + 1 < len(entry.received):
            raise HandshakeError("sent more than its answer before the controller's proof")


class Refusal(enum.Enum):
    """Why a connection was refused, as the summary counts it."""

    SILENT = "sent no answer in time"
    SHED = "shed to make room for newer connections"
    CLOSED = "closed before answering"
    NOT_AN_AGENT = "not a zlaunch agent"
    WRONG_TOKEN = "without this job's token"
    NOT_A_NODE = "a node not of this job"
    TWICE = "a node that had connected already"
    NO_DESCRIPTOR = "turned away while no file descriptor was free"
    FAILED = "failed at the network"


class RefusalTally:
    """Tells ``report`` of the first ``detailed`` refusals in full; the rest are counted by
    kind and address for one :meth:`summary` line."""

    def __init__(self, report: Callable[[str], None], detailed: int = 3, addresses: int = 3):
        self._report = report
        self._detailed = detailed
        self._addresses = addresses
        self.total = 0
        self.by_kind: collections.Counter[Refusal] = collections.Counter()
        self._by_address: collections.Counter[str] = collections.Counter()
        self._said_more = False
        self._notes: set[str] = set()

    def refused(self, kind: Refusal, peer: str, message: str) -> None:
        self.total += 1
        self.by_kind[kind] += 1
        self._by_address[_address(peer)] += 1
        if self.total <= self._detailed:
            self._report(message)
        elif not self._said_more:
            self._said_more = True
            self._report("more connections are being refused; a count follows once the agents "
                         "are in")  # fmt: skip

    def note_once(self, message: str) -> None:
        """A condition worth one line however often it happens (no descriptors left)."""
        if message not in self._notes:
            self._notes.add(message)
            self._report(message)

    def summary(self) -> str | None:
        """One line for every refusal past the detailed ones, or None when there were none."""
        if self.total <= self._detailed:
            return None
        kinds = ", ".join(f"{n} {kind.value}" for kind, n in self.by_kind.most_common())
        top = self._by_address.most_common(self._addresses)
        sources = ", ".join(f"{address} ({n})" for address, n in top)
        others = len(self._by_address) - len(top)
        if others > 0:
            sources += f" and {others} more address{'es' if others > 1 else ''}"
        return (
            f"refused {self.total} connections on the agents' port while they connected back "
            f"({kinds}); from {sources}"
        )


def _address(peer: str) -> str:
    """``10.0.0.5:41234`` -> ``10.0.0.5``, ``[::1]:41234`` -> ``::1``."""
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        return peer
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
